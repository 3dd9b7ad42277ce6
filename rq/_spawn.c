/* rq._spawn: start a queue job with one exec (SPEC S6.1, S6.3).
 *
 * Owns the child side of a job start: between vfork() and execve() the child
 * starts a new session, puts /dev/null on fd 0, job/stdio.log (append) on
 * fd 1 and 2, the job's pipes on fd 3 and 4, sets nice 19, gives back the
 * default signal dispositions, changes to the job directory, appends the
 * `RQ START` header with its own pid and execs the command (a PATH search
 * for a bare name; a file without `#!` runs under /bin/sh, as a shell would).
 * On failure it writes `RQ EXEC FAILED - ...` to stdio.log and exits 127.
 *
 * rq.proc.spawn_job uses it when it was built (setup.py marks it optional: no
 * compiler, no module); otherwise a /bin/sh wrapper does the same steps at the
 * cost of a second exec per job.  The child only makes system calls on memory
 * prepared by the parent before vfork(): no allocation, no Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

struct job {
    char **argv;        /* the command, NULL-terminated */
    char **envp;        /* KEY=VALUE, NULL-terminated */
    char **sh_argv;     /* room for /bin/sh FILE ARGS... (ENOEXEC) */
    const char *cwd;
    const char *log;
    const char *header; /* the text after "<pid> - " */
    const char *path;   /* PATH of the job's environment, or NULL */
    char *buf;          /* room for one PATH candidate */
    size_t buf_size;
    int write_fd, read_fd;
    /* written by the child (vfork shares the parent's memory): its start
     * time in clock ticks since boot, field 22 of /proc/self/stat.  Read by
     * the parent after exec, it would wait for the exec to finish. */
    unsigned long long start_ticks;
    int have_start;
    char stat[1024];
};

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static void write_str(int fd, const char *s) { write_all(fd, s, strlen(s)); }

static void write_header(const struct job *j)
{
    char digits[24];
    char out[26];
    size_t n = 0, k = 0;
    unsigned long pid = (unsigned long)getpid();
    do {
        digits[n++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0);
    out[k++] = '\n';
    while (n > 0)
        out[k++] = digits[--n];
    write_all(1, out, k);
    write_str(1, " - ");
    write_str(1, j->header);
    write_str(1, "\n");
}

/* execve `file`; on ENOEXEC run it under /bin/sh.  Returns only on failure. */
static void try_exec(const struct job *j, const char *file)
{
    execve(file, j->argv, j->envp);
    if (errno == ENOEXEC) {
        size_t i = 0;
        j->sh_argv[0] = "/bin/sh";
        j->sh_argv[1] = (char *)file;
        for (i = 1; j->argv[i] != NULL; i++)
            j->sh_argv[i + 1] = j->argv[i];
        j->sh_argv[i + 1] = NULL;
        execve("/bin/sh", j->sh_argv, j->envp);
    }
}

static void exec_command(const struct job *j)
{
    const char *name = j->argv[0];
    const char *p;
    size_t name_len = strlen(name);

    if (name_len == 0)
        return;
    if (strchr(name, '/') != NULL) {
        try_exec(j, name);
        return;
    }
    p = j->path != NULL ? j->path : "/usr/local/bin:/usr/bin:/bin";
    for (;;) {
        const char *end = strchr(p, ':');
        size_t dir_len = end != NULL ? (size_t)(end - p) : strlen(p);
        if (dir_len == 0) {              /* an empty entry means the cwd */
            if (name_len + 1 <= j->buf_size) {
                memcpy(j->buf, name, name_len + 1);
                try_exec(j, j->buf);
            }
        } else if (dir_len + 1 + name_len + 1 <= j->buf_size) {
            memcpy(j->buf, p, dir_len);
            j->buf[dir_len] = '/';
            memcpy(j->buf + dir_len + 1, name, name_len + 1);
            try_exec(j, j->buf);
        }
        if (end == NULL)
            return;
        p = end + 1;
    }
}

static void read_start_ticks(struct job *j)
{
    ssize_t n;
    char *p;
    int field = 3;   /* the first field after "(comm) " is field 3, the state */
    unsigned long long v = 0;
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return;
    n = read(fd, j->stat, sizeof j->stat - 1);
    close(fd);
    if (n <= 0)
        return;
    j->stat[n] = '\0';
    p = strrchr(j->stat, ')');
    if (p == NULL || p[1] != ' ')
        return;
    for (p += 2; *p != '\0' && field < 22; p++)
        if (*p == ' ')
            field++;
    if (field != 22 || *p < '0' || *p > '9')
        return;
    for (; *p >= '0' && *p <= '9'; p++)
        v = v * 10 + (unsigned long long)(*p - '0');
    j->start_ticks = v;
    j->have_start = 1;
}

static void reset_signals(void)
{
    struct sigaction dfl, old;
    sigset_t none;
    int sig;

    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (sig = 1; sig < NSIG; sig++) {
        if (sigaction(sig, NULL, &old) != 0)
            continue;
        /* caught signals (exec would reset them, but one could arrive before
         * it and run the parent's handler here), and the two that Python
         * ignores; other ignored signals stay ignored, as with posix_spawn */
        if ((old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) ||
            (old.sa_handler == SIG_IGN && (sig == SIGPIPE || sig == SIGXFSZ)))
            sigaction(sig, &dfl, NULL);
    }
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

static void put_fd(int fd, int target)
{
    if (fd != target) {
        dup2(fd, target);
        close(fd);
    }
}

__attribute__((noinline, noreturn)) static void child(struct job *j)
{
    int fd;

    read_start_ticks(j);
    setsid();
    fd = open("/dev/null", O_RDONLY);
    if (fd < 0)
        _exit(127);
    put_fd(fd, 0);
    fd = open(j->log, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0)
        _exit(127);
    put_fd(fd, 1);
    dup2(1, 2);
    dup2(j->write_fd, 3);   /* both are >= 10 and close-on-exec (rq.proc) */
    dup2(j->read_fd, 4);
    setpriority(PRIO_PROCESS, 0, 19);
    reset_signals();
    if (chdir(j->cwd) != 0) {
        write_str(2, "RQ EXEC FAILED - cannot change to the job directory\n");
        _exit(127);
    }
    write_header(j);
    exec_command(j);
    write_str(2, "RQ EXEC FAILED - ");
    write_str(2, j->argv[0]);
    write_str(2, ": not found or not executable\n");
    _exit(127);
}

/* A NULL-terminated array of the bytes items of `seq` (a list); the strings
 * stay owned by the list.  NULL with an exception set on error. */
static char **byte_strings(PyObject *seq, const char *what, Py_ssize_t extra)
{
    Py_ssize_t n, i;
    char **out;

    if (!PyList_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of bytes", what);
        return NULL;
    }
    n = PyList_GET_SIZE(seq);
    out = PyMem_Calloc((size_t)(n + extra + 1), sizeof(char *));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(seq, i);
        if (!PyBytes_Check(item)) {
            PyMem_Free(out);
            PyErr_Format(PyExc_TypeError, "%s must be a list of bytes", what);
            return NULL;
        }
        out[i] = PyBytes_AS_STRING(item);
        if (strlen(out[i]) != (size_t)PyBytes_GET_SIZE(item)) {
            PyMem_Free(out);
            PyErr_Format(PyExc_ValueError, "embedded null byte in %s", what);
            return NULL;
        }
    }
    return out;
}

PyDoc_STRVAR(spawn_job_doc,
"spawn_job(argv, envp, cwd, stdio_log, header, write_fd, read_fd, path)\n"
"    -> (pid, start_ticks or None)\n\n"
"Start a job as described in the module comment of rq/_spawn.c.  argv and\n"
"envp are lists of bytes (envp items KEY=VALUE); path is the PATH of envp or\n"
"None.  Returns the pid, which is also the job's session and group id, and\n"
"its start time in clock ticks since boot (/proc/PID/stat field 22).");

static PyObject *spawn_job(PyObject *self, PyObject *args)
{
    PyObject *argv_list, *envp_list;
    const char *cwd, *log, *header, *path;
    Py_ssize_t path_len = 0;
    int write_fd, read_fd, saved_errno = 0;
    struct job j;
    sigset_t all, old;
    pid_t pid;

    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!yyyiiz#", &PyList_Type, &argv_list, &PyList_Type,
                          &envp_list, &cwd, &log, &header, &write_fd, &read_fd, &path,
                          &path_len))
        return NULL;
    if (PyList_GET_SIZE(argv_list) == 0) {
        PyErr_SetString(PyExc_ValueError, "argv must not be empty");
        return NULL;
    }
    if (write_fd < 10 || read_fd < 10) {
        PyErr_SetString(PyExc_ValueError, "the job's pipe ends must be descriptors >= 10");
        return NULL;
    }
    memset(&j, 0, sizeof j);
    j.cwd = cwd;
    j.log = log;
    j.header = header;
    j.path = path;
    j.write_fd = write_fd;
    j.read_fd = read_fd;
    j.argv = byte_strings(argv_list, "argv", 0);
    j.envp = j.argv != NULL ? byte_strings(envp_list, "envp", 0) : NULL;
    j.sh_argv = j.envp != NULL ? byte_strings(argv_list, "argv", 1) : NULL;
    j.buf_size = (size_t)path_len + 2 + strlen(j.argv != NULL ? j.argv[0] : "") + 1;
    j.buf = j.sh_argv != NULL ? PyMem_Malloc(j.buf_size) : NULL;
    if (j.buf == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        PyMem_Free(j.argv);
        PyMem_Free(j.envp);
        PyMem_Free(j.sh_argv);
        return NULL;
    }

    /* No signal handler may run in the child before it resets them. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    Py_BEGIN_ALLOW_THREADS
    pid = vfork();
    if (pid == 0)
        child(&j);
    saved_errno = errno;
    Py_END_ALLOW_THREADS
    pthread_sigmask(SIG_SETMASK, &old, NULL);

    PyMem_Free(j.argv);
    PyMem_Free(j.envp);
    PyMem_Free(j.sh_argv);
    PyMem_Free(j.buf);
    if (pid < 0) {
        errno = saved_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (!j.have_start)
        return Py_BuildValue("(lO)", (long)pid, Py_None);
    return Py_BuildValue("(lK)", (long)pid, j.start_ticks);
}

static PyMethodDef methods[] = {
    {"spawn_job", spawn_job, METH_VARARGS, spawn_job_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rq._spawn",
    "Start a queue job with one exec (see rq/_spawn.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__spawn(void) { return PyModule_Create(&module); }
