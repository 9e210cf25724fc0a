/*
 * taskgate-hold: holds a worker until the scheduler releases it, then runs it.
 *
 * The compiled form of the /bin/sh trampoline in services/scheduler/processes.py:
 *
 *     read -r go && [ "$go" = go ] || exit 111; unset PWD; exec "$@" </dev/null
 *
 * Started as `taskgate-hold COMMAND [ARG...]` with the hold pipe as its stdin. It reads
 * "go\n" (anything else, or the pipe closing first because the scheduler died, ends it with
 * status 111 before anything of the command ran), drops PWD from the environment, puts
 * /dev/null on stdin and execs COMMAND the way dash's `exec` does: a name without a slash
 * is looked up along the environment's PATH, a file the kernel cannot execute (ENOEXEC) is
 * run by /bin/sh, and a failure exits 127 (not found), 126 (permission denied) or 2.
 *
 * Why not the shell: on a VM that traps CPUID, a dynamically linked program's start-up
 * (the loader, glibc's CPU feature probing) costs more than half a millisecond of CPU, and
 * the shell paid it once per task on top of the worker's own start. This program uses no C
 * library at all: raw system calls, its own _start. x86-64 Linux only; elsewhere the
 * scheduler keeps the shell (`[tasks] worker_hold`).
 */
#if !defined(__x86_64__) || !defined(__linux__)
#error "taskgate-hold is written for x86-64 Linux; elsewhere the scheduler holds workers with /bin/sh"
#endif

#define ABANDONED 111

#define SYS_read 0
#define SYS_write 1
#define SYS_close 3
#define SYS_execve 59
#define SYS_exit_group 231
#define SYS_openat 257
#define SYS_dup3 292

#define AT_FDCWD (-100)
#define O_RDONLY 0
#define ENOENT 2
#define EINTR 4
#define ENOEXEC 8
#define EACCES 13
#define ENOTDIR 20
#define ENAMETOOLONG 36
#define PATH_MAX 4096

/* dash's default when the environment has no PATH. */
static const char default_path[] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
static const char bin_sh[] = "/bin/sh";

static long sys4(long n, long a, long b, long c, long d) {
    register long r10 __asm__("r10") = d;
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return ret;
}

static __attribute__((noreturn)) void quit(int status) {
    for (;;)
        sys4(SYS_exit_group, status, 0, 0, 0);
}

static unsigned long length(const char *s) {
    unsigned long n = 0;
    while (s[n])
        n++;
    return n;
}

static void say(const char *s) { sys4(SYS_write, 2, (long)s, (long)length(s), 0); }

/* "taskgate-hold: exec: NAME: WHY" on stderr (the attempt's log), then exit. */
static __attribute__((noreturn)) void fail(const char *name, int err) {
    int status = err == ENOENT ? 127 : err == EACCES ? 126 : 2;
    say("taskgate-hold: exec: ");
    say(name);
    say(err == ENOENT ? ": not found\n" : err == EACCES ? ": Permission denied\n" : ": cannot execute\n");
    quit(status);
}

static int is_var(const char *entry, const char *name) {
    while (*name)
        if (*entry++ != *name++)
            return 0;
    return *entry == '=';
}

/* execve, and as dash does, a file the kernel refuses as ENOEXEC is run by /bin/sh. `argv`
 * is the whole argument vector of this program: argv[0] is free to hold "/bin/sh". */
static long try_exec(const char *file, char **argv, char **envp) {
    long err = -sys4(SYS_execve, (long)file, (long)(argv + 1), (long)envp, 0);
    if (err == ENOEXEC) {
        char *own = argv[0], *name = argv[1];
        argv[0] = (char *)bin_sh;
        argv[1] = (char *)file;
        err = -sys4(SYS_execve, (long)bin_sh, (long)argv, (long)envp, 0);
        argv[0] = own; /* the PATH search goes on with the command's own words */
        argv[1] = name;
    }
    return err;
}

int hold_main(long argc, char **argv, char **envp) {
    char go[3];
    long got = 0;
    while (got < 3) {
        long n = sys4(SYS_read, 0, (long)(go + got), 3 - got, 0);
        if (n == -EINTR)
            continue;
        if (n <= 0)
            quit(ABANDONED); /* the scheduler closed the pipe: run nothing */
        got += n;
    }
    if (go[0] != 'g' || go[1] != 'o' || go[2] != '\n' || argc < 2)
        quit(ABANDONED);

    const char *path = 0;
    char **kept = envp;
    for (char **entry = envp; *entry; entry++) {
        if (is_var(*entry, "PWD"))
            continue;
        if (is_var(*entry, "PATH"))
            path = *entry + 5;
        *kept++ = *entry;
    }
    *kept = 0;

    long null = sys4(SYS_openat, AT_FDCWD, (long)"/dev/null", O_RDONLY, 0);
    if (null < 0)
        fail("/dev/null", (int)-null);
    if (null != 0) {
        sys4(SYS_dup3, null, 0, 0, 0);
        sys4(SYS_close, null, 0, 0, 0);
    }

    const char *name = argv[1];
    for (const char *c = name; *c; c++)
        if (*c == '/')
            fail(name, (int)try_exec(name, argv, envp));

    if (path == 0)
        path = default_path;
    unsigned long name_len = length(name);
    long err = ENOENT;
    char file[PATH_MAX];
    for (const char *dir = path;;) {
        const char *end = dir;
        while (*end && *end != ':')
            end++;
        unsigned long dir_len = (unsigned long)(end - dir);
        if (dir_len + 1 + name_len + 1 > sizeof file) {
            err = ENAMETOOLONG;
        } else {
            unsigned long at = 0;
            if (dir_len == 0) /* an empty element is the current folder */
                file[at++] = '.';
            for (unsigned long i = 0; i < dir_len; i++)
                file[at++] = dir[i];
            file[at++] = '/';
            for (unsigned long i = 0; i <= name_len; i++)
                file[at++] = name[i];
            long e = try_exec(file, argv, envp);
            if (e != ENOENT && e != ENOTDIR)
                err = e;
        }
        if (*end == 0)
            break;
        dir = end + 1;
    }
    fail(name, (int)err);
}

/* The kernel's entry: argc at the stack pointer, then argv, a NULL, envp. */
__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "  xor %rbp, %rbp\n"
        "  mov (%rsp), %rdi\n"
        "  lea 8(%rsp), %rsi\n"
        "  lea 16(%rsp,%rdi,8), %rdx\n"
        "  and $-16, %rsp\n"
        "  call hold_main\n"
        "  hlt\n");
