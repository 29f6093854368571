/* A "native plugin" that tries, before anything else, every way out of its process that
 * docs/native-plugins.md says is closed, and writes one line per attempt on stderr:
 * "NAME RESULT", RESULT the errno name of the refusal or "ok" if it was not refused. Then it
 * says a HELLO (the secret it was given) and waits for the channel to close, so that the host
 * sees a plugin that started. tests/host/test_native_runtime.py builds it with the system's C
 * compiler, runs it through the real launcher and reads the lines. Each attempt is harmless
 * unwalled too: what it makes it closes or ends, and the ptrace and mount aim at nothing that
 * exists; only the walls make each line the refusal the test expects. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static void report(const char *name, long result) {
    if (result >= 0)
        fprintf(stderr, "%s ok\n", name);
    else
        fprintf(stderr, "%s %s\n", name, strerrorname_np(errno));
}

static long closed(long fd) {
    if (fd >= 0)
        close((int)fd);
    return fd;
}

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

static void hello(void) {
    const char *hex = getenv("WASIHOST_CHILD_SECRET");
    unsigned char f[64];
    size_t n = 4;
    f[n++] = 0x85; f[n++] = 0x01; f[n++] = 0x01; f[n++] = 0x58; f[n++] = 32;
    for (int i = 0; i < 32; i++)
        f[n++] = hex && strlen(hex) == 64 ? hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]) : 0;
    f[n++] = 0x00;  /* pid 0 */
    f[n++] = 0x80;  /* no walls of its own */
    unsigned len = n - 4;
    f[0] = len >> 24; f[1] = len >> 16; f[2] = len >> 8; f[3] = len;
    if (write(0, f, n) != (ssize_t)n)
        exit(3);
}

int main(void) {
    pid_t parent = getppid();
    report("socket-inet", closed(socket(AF_INET, SOCK_STREAM, 0)));
    report("socket-unix", closed(socket(AF_UNIX, SOCK_STREAM, 0)));
    int pair[2];
    long made = socketpair(AF_UNIX, SOCK_STREAM, 0, pair);
    if (made == 0) { close(pair[0]); close(pair[1]); }
    report("socketpair", made);
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    if (child > 0)
        waitpid(child, NULL, 0);
    report("fork", child);
    long vforked = syscall(SYS_vfork);
    if (vforked == 0)
        _exit(0);
    report("vfork", vforked);
    char *argv[] = {"sh", "-c", "exit 0", NULL};
    report("execve-shell", execve("/bin/sh", argv, NULL));
    report("open-passwd", closed(open("/etc/passwd", O_RDONLY)));
    report("open-proc-parent", closed(open("/proc/1/environ", O_RDONLY)));
    report("create-file", closed(open("/tmp/wasihost-escape-probe", O_WRONLY | O_CREAT, 0600)));
    report("memfd_create", closed(syscall(SYS_memfd_create, "x", 0)));
    /* A pid no process has: unwalled, the kernel says ESRCH; walled, the filter says EPERM. */
    report("ptrace", ptrace(PTRACE_ATTACH, 0x3ffffffe, NULL, NULL));
    report("kill-parent", kill(parent, 0));
    report("setsid", setsid());
    report("setpgid", setpgid(0, 0));
    report("unshare-user", unshare(CLONE_NEWUSER));
    /* A target that does not exist: unwalled ENOENT (or EPERM without CAP_SYS_ADMIN). */
    report("mount", mount("none", "/nonexistent/wasihost", "tmpfs", 0, NULL));
    report("chroot", chroot("/"));
    struct rlimit more = {RLIM_INFINITY, RLIM_INFINITY};
    report("raise-rlimit", setrlimit(RLIMIT_AS, &more));
    char byte;
    struct iovec local = {&byte, 1}, remote = {(void *)0x400000, 1};
    report("process_vm_readv", process_vm_readv(parent, &local, 1, &remote, 1, 0));
    report("bpf", syscall(SYS_bpf, 0, NULL, 0));
    report("io_uring_setup", syscall(SYS_io_uring_setup, 1, NULL));
    report("userfaultfd", closed(syscall(SYS_userfaultfd, 0)));
    report("perf_event_open", closed(syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0)));
    fprintf(stderr, "done\n");
    hello();
    char buf[4096];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
