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
 * prepared by the parent before vfork(): no allocation, no Python.  The parent
 * waits for its exec, so each step of the child is a step of every start: the
 * job's start time is worked out from two clock reads rather than read from
 * /proc/self/stat, and the header is one write (issue 15).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <time.h>
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
    /* written by the child (vfork shares the parent's memory) as its first
     * step: CLOCK_BOOTTIME then, in ns (see spawn_job) */
    long long child_ns;
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

/* "\n<pid> - <header>\n", in one write when it fits the buffer (a header
 * names the script's real path: up to PATH_MAX) */
static void write_header(const struct job *j)
{
    char digits[24];
    char out[4352];
    size_t n = 0, k = 0, len = strlen(j->header);
    unsigned long pid = (unsigned long)getpid();
    do {
        digits[n++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0);
    out[k++] = '\n';
    while (n > 0)
        out[k++] = digits[--n];
    memcpy(out + k, " - ", 3);
    k += 3;
    if (k + len + 1 > sizeof out) {
        write_all(1, out, k);
        write_all(1, j->header, len);
        write_str(1, "\n");
        return;
    }
    memcpy(out + k, j->header, len);
    k += len;
    out[k++] = '\n';
    write_all(1, out, k);
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

static long long boottime_ns(void)
{
    struct timespec t;
    if (clock_gettime(CLOCK_BOOTTIME, &t) != 0)   /* the vDSO, normally */
        return 0;
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
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

    j->child_ns = boottime_ns();
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
    long long before, tick_ns;
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
    before = boottime_ns();
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
    /* The job's start time (/proc/PID/stat field 22: its task's start_boottime in
     * clock ticks) lies between `before` and the child's first step: known when
     * both fall in one tick (all but a few starts in a thousand here), without
     * the child reading /proc/self/stat (~17 us of each start's wait, issue 15). */
    tick_ns = 1000000000LL / sysconf(_SC_CLK_TCK);
    if (before == 0 || j.child_ns == 0 || before / tick_ns != j.child_ns / tick_ns)
        return Py_BuildValue("(lO)", (long)pid, Py_None);
    return Py_BuildValue("(lK)", (long)pid, (unsigned long long)(before / tick_ns));
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
