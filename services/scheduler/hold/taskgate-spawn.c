/*
 * taskgate-spawn: starts held workers for the scheduler, as the scheduler's own children.
 *
 * Why: spawning from the scheduler (CPython's subprocess, on a thread) cost it ~0.8 ms of CPU
 * per task under load — the Python of Popen, the move into the attempt's cgroup, reading the
 * start time — all under its one GIL. This program does the same steps in C, on the other
 * core, and the scheduler only sends a request and reads the answer.
 *
 * Started by the scheduler as `taskgate-spawn FD`, FD one end of a SOCK_SEQPACKET socket
 * pair (the only way to reach it: no path, nothing a worker inherits). Each request is one
 * message:
 *
 *     struct request, then the log path, the cgroup folder ("" for none), cwd, argv[0..argc)
 *     and envp[0..envc) as NUL-terminated strings; SCM_RIGHTS: the hold pipe, the token pipe.
 *
 * For each it opens the attempt's log (created 0600, its folder 0700 if missing, never
 * through a symlink), makes the attempt's cgroup folder, and clones a child with
 * clone3(CLONE_PARENT | CLONE_PIDFD | CLONE_VFORK | CLONE_INTO_CGROUP): the child's parent
 * is the scheduler (which waits for it and is the subreaper for its orphans, as before), it
 * is born in its cgroup (no migration; cgroup v1: it writes itself into cgroup.procs), and
 * this program is suspended until the child has exec'd. The child starts a new session, gets
 * the hold pipe as stdin, the log as stdout and stderr, the token pipe as fd 3 and nothing
 * else (every other descriptor is closed at the exec), enters cwd, switches to the profile's
 * user when asked (its uid and gid, no supplementary groups), sets the umask and execs argv[0]
 * (an absolute path: the hold, which waits for "go" before it runs the command).
 *
 * The answer is one message: struct reply (the pid, or the failed step and its errno; the
 * kernel start time read from /proc while the child is held) with the pidfd as SCM_RIGHTS.
 * Requests are served one at a time, in order. The socket closing (the scheduler exited)
 * ends this program. `--legacy-clone` starts it with clone() as if clone3 were filtered out
 * (for the tests of that path).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

#define SOCKET_FD 3
#define MAGIC 0x74677370u /* "tgsp" */
#define FLAG_CGROUP_V1 2u /* the cgroup is v1's: the child moves itself in through cgroup.procs */
#define FLAG_RUN_AS 4u    /* the child switches to run_uid/run_gid (no supplementary groups) */
#define MAX_REQUEST (1u << 20)
#define MAX_ARGS 65536

/* The steps a spawn can fail at (reply.stage). */
enum {
    STAGE_REQUEST = 1,
    STAGE_CLONE,
    STAGE_SETSID,
    STAGE_FDS,
    STAGE_CHDIR,
    STAGE_EXEC,
    STAGE_CGROUP_JOIN,
    STAGE_PIPE,
    STAGE_LOG,
    STAGE_CGROUP,
    STAGE_USER,
};

struct request {
    uint32_t magic;
    uint32_t id;
    uint32_t flags;
    uint32_t umask;
    uint32_t argc;
    uint32_t envc;
    uint32_t run_uid;
    uint32_t run_gid;
};

struct reply {
    uint32_t id;
    int32_t pid; /* 0: no child */
    int32_t stage;
    int32_t error;
    uint64_t start_time; /* clock ticks after boot; 0: the child was gone before it was read */
};

struct child_error {
    int32_t stage;
    int32_t error;
};

static char buffer[MAX_REQUEST + 1];
/* clone3 filtered out (a container runtime's seccomp profile answers ENOSYS): clone() from then
 * on, and the child joins its cgroup itself. */
static int legacy_clone;
static char *arg_pointers[MAX_ARGS + 2];

static void send_reply(const struct reply *r, int pidfd) {
    struct iovec iov = {(void *)r, sizeof *r};
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (pidfd >= 0) {
        memset(&control, 0, sizeof control);
        msg.msg_control = control.space;
        msg.msg_controllen = sizeof control.space;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pidfd, sizeof(int));
    }
    while (sendmsg(SOCKET_FD, &msg, MSG_NOSIGNAL) < 0) {
        if (errno != EINTR)
            exit(0); /* the scheduler is gone */
    }
}

/* Field 22 of /proc/<pid>/stat (the start time), 0 when it cannot be read. */
static uint64_t start_time_of(pid_t pid) {
    char path[64], stat[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, stat, sizeof stat - 1);
    close(fd);
    if (n <= 0)
        return 0;
    stat[n] = 0;
    char *p = strrchr(stat, ')'); /* the name may hold spaces and parentheses */
    if (p == NULL)
        return 0;
    p++;
    for (int field = 3; field < 22 && p != NULL; field++) /* p: the space before field 3 (the state) */
        p = strchr(p + 1, ' ');
    return p == NULL ? 0 : strtoull(p + 1, NULL, 10);
}

static __attribute__((noreturn)) void child_fail(int error_fd, int stage) {
    struct child_error e = {stage, errno};
    ssize_t ignored = write(error_fd, &e, sizeof e);
    (void)ignored;
    _exit(127);
}

static __attribute__((noreturn)) void child(const struct request *rq, const char *cwd, char **argv, char **envp,
                                            const int *fds, int log_fd, int cgroup_fd, int error_fd) {
    if (setsid() < 0)
        child_fail(error_fd, STAGE_SETSID);
    if (cgroup_fd >= 0 && ((rq->flags & FLAG_CGROUP_V1) || legacy_clone)) {
        int procs = openat(cgroup_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
        if (procs < 0 || write(procs, "0\n", 2) != 2) /* "0": the writing process itself */
            child_fail(error_fd, STAGE_CGROUP_JOIN);
        close(procs);
    }
    /* Every descriptor here but 0-3 is above 3 (0-3 are open in this program), so none of
     * the sources is overwritten before it is copied. */
    if (dup2(fds[0], 0) < 0 || dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0 || dup2(fds[1], 3) < 0)
        child_fail(error_fd, STAGE_FDS);
    /* Everything else closes at the exec; the error pipe stays usable until then. */
    if (syscall(SYS_close_range, 4u, ~0u, CLOSE_RANGE_CLOEXEC) < 0) {
        for (int fd = 4; fd < 1024; fd++)
            if (fd != error_fd)
                fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    if (chdir(cwd) < 0)
        child_fail(error_fd, STAGE_CHDIR);
    /* The profile's user, after the workspace was entered as the scheduler's (as a spawn by the
     * scheduler itself did): here, in a single-threaded copy of this program, a plain switch. */
    if (rq->flags & FLAG_RUN_AS) {
        if (geteuid() == 0 && setgroups(0, NULL) < 0)
            child_fail(error_fd, STAGE_USER);
        if (setresgid(rq->run_gid, rq->run_gid, rq->run_gid) < 0 || setresuid(rq->run_uid, rq->run_uid, rq->run_uid) < 0)
            child_fail(error_fd, STAGE_USER);
    }
    umask((mode_t)rq->umask);
    execve(argv[0], argv, envp);
    child_fail(error_fd, STAGE_EXEC);
}

/* Splits `count` NUL-terminated strings from *at (bounded by end) into out[0..count), NULL-ended. */
static int split(char **at, const char *end, uint32_t count, char **out) {
    for (uint32_t i = 0; i < count; i++) {
        char *nul = memchr(*at, 0, (size_t)(end - *at));
        if (nul == NULL)
            return -1;
        out[i] = *at;
        *at = nul + 1;
    }
    out[count] = NULL;
    return 0;
}

/* The attempt's log for appending: created 0600, never through a symlink; its folder (0700)
 * only made when the open finds it missing, so a launch costs one open. */
static int open_log(char *path) {
    int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW;
    int fd = open(path, flags, 0600);
    if (fd >= 0 || errno != ENOENT)
        return fd;
    for (char *slash = strchr(path + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
        *slash = 0;
        int made = mkdir(path, 0700);
        *slash = '/';
        if (made < 0 && errno != EEXIST)
            return -1;
    }
    return open(path, flags, 0600);
}

static void serve(ssize_t size, int *fds, int nfds) {
    struct reply r = {0};
    struct request rq;
    if ((size_t)size < sizeof rq) {
        r.stage = STAGE_REQUEST, r.error = EINVAL;
        send_reply(&r, -1);
        return;
    }
    memcpy(&rq, buffer, sizeof rq);
    r.id = rq.id;
    char *at = buffer + sizeof rq, *end = buffer + size;
    char *paths[4]; /* log, cgroup, cwd */
    char **argv = arg_pointers, **envp = arg_pointers + rq.argc + 1;
    if (rq.magic != MAGIC || nfds != 2 || rq.argc == 0 || rq.argc + rq.envc + 2 > MAX_ARGS ||
        split(&at, end, 3, paths) < 0 || split(&at, end, rq.argc, argv) < 0 || split(&at, end, rq.envc, envp) < 0 ||
        argv[0][0] != '/' || paths[0][0] != '/') {
        r.stage = STAGE_REQUEST, r.error = EINVAL;
        send_reply(&r, -1);
        return;
    }
    char *log_path = paths[0], *cgroup = paths[1], *cwd = paths[2];
    int log_fd = open_log(log_path);
    if (log_fd < 0) {
        r.stage = STAGE_LOG, r.error = errno;
        send_reply(&r, -1);
        return;
    }
    int cgroup_fd = -1;
    if (cgroup[0] != 0) {
        if (mkdir(cgroup, 0755) < 0 && errno != EEXIST)
            cgroup_fd = -1;
        else
            cgroup_fd = open(cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (cgroup_fd < 0) {
            r.stage = STAGE_CGROUP, r.error = errno;
            close(log_fd);
            send_reply(&r, -1);
            return;
        }
    }
    int error_pipe[2];
    if (pipe2(error_pipe, O_CLOEXEC) < 0) {
        r.stage = STAGE_PIPE, r.error = errno;
        close(log_fd);
        if (cgroup_fd >= 0)
            close(cgroup_fd);
        send_reply(&r, -1);
        return;
    }
    int pidfd = -1;
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_PARENT | CLONE_PIDFD | CLONE_VFORK;
    args.pidfd = (uint64_t)(uintptr_t)&pidfd;
    if (cgroup_fd >= 0 && !(rq.flags & FLAG_CGROUP_V1)) {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = (uint64_t)cgroup_fd;
    }
    /* Without CLONE_VM the child has its own copy of this (single-threaded) program, as after
     * fork(); CLONE_VFORK only makes this call return once the child has exec'd or exited. */
    long pid = legacy_clone ? -1 : syscall(SYS_clone3, &args, sizeof args);
    if (pid < 0 && (legacy_clone || errno == ENOSYS)) {
        legacy_clone = 1;
        pid = syscall(SYS_clone, (unsigned long)(CLONE_PARENT | CLONE_PIDFD | CLONE_VFORK), 0L, &pidfd, 0L, 0L);
    }
    if (pid == 0)
        child(&rq, cwd, argv, envp, fds, log_fd, cgroup_fd, error_pipe[1]);
    close(error_pipe[1]);
    close(log_fd);
    if (cgroup_fd >= 0)
        close(cgroup_fd);
    if (pid < 0) {
        r.stage = STAGE_CLONE, r.error = errno;
        close(error_pipe[0]);
        send_reply(&r, -1);
        return;
    }
    r.pid = (int32_t)pid;
    struct child_error e;
    ssize_t got;
    do
        got = read(error_pipe[0], &e, sizeof e);
    while (got < 0 && errno == EINTR);
    close(error_pipe[0]);
    if (got == (ssize_t)sizeof e) {
        r.stage = e.stage, r.error = e.error; /* the child exits 127; the scheduler reaps it */
    } else {
        r.start_time = start_time_of((pid_t)pid); /* held: alive until the scheduler says go */
    }
    send_reply(&r, pidfd);
    close(pidfd);
}

int main(int argc, char **argv) {
    /* Not dumpable: a process of the same user (a worker running as the scheduler's user) can
     * neither trace this one nor take its socket with pidfd_getfd(). Each worker's exec makes
     * the worker dumpable again as usual. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    /* Workers start from a clean slate whatever the scheduler had: no blocked or ignored signal. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            signal(sig, SIG_DFL);
    /* 0-2 open (else a received descriptor could take one of their numbers), the socket at 3. */
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd)
            return 2;
    if (argc == 3 && strcmp(argv[2], "--legacy-clone") == 0)
        legacy_clone = 1;
    int given = argc == 2 || argc == 3 ? atoi(argv[1]) : -1;
    struct stat st;
    if (given < 3 || fstat(given, &st) < 0 || !S_ISSOCK(st.st_mode)) {
        fprintf(stderr, "usage: taskgate-spawn FD [--legacy-clone] (FD: the scheduler's end of a SOCK_SEQPACKET socket pair)\n");
        return 2;
    }
    if (given != SOCKET_FD) {
        if (dup3(given, SOCKET_FD, O_CLOEXEC) < 0)
            return 2;
        close(given);
    } else {
        fcntl(SOCKET_FD, F_SETFD, FD_CLOEXEC);
    }
    for (;;) {
        struct iovec iov = {buffer, MAX_REQUEST + 1};
        union {
            struct cmsghdr align;
            char space[CMSG_SPACE(2 * sizeof(int))];
        } control;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                             .msg_controllen = sizeof control.space};
        ssize_t size = recvmsg(SOCKET_FD, &msg, MSG_CMSG_CLOEXEC);
        if (size < 0 && errno == EINTR)
            continue;
        if (size <= 0)
            return 0; /* the scheduler closed its end */
        int fds[2], nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < n; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (nfds < 2)
                    fds[nfds++] = fd;
                else
                    close(fd);
            }
        }
        if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || (size_t)size > MAX_REQUEST) {
            struct reply r = {0};
            memcpy(&r.id, buffer + 4, sizeof r.id);
            r.stage = STAGE_REQUEST, r.error = E2BIG;
            send_reply(&r, -1);
        } else {
            serve(size, fds, nfds);
        }
        /* The next worker's copy of this program (until its exec) holds its own request only,
         * never another profile's environment. */
        memset(buffer, 0, (size_t)size < sizeof buffer ? (size_t)size : sizeof buffer);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
    }
}
