"""Type stub of the C helper built from rq/_spawn.c (see that file)."""

def spawn_job(argv: list[bytes], envp: list[bytes], cwd: bytes, stdio_log: bytes,
              header: bytes, write_fd: int, read_fd: int, path: bytes | None,
              /) -> tuple[int, int | None]: ...
