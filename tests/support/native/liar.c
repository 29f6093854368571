/* A "native plugin" that lies in its HELLO: it claims, in place of the walls the launcher
 * checked, one wall with the detail "lies: every wall". Built with -DWRONG_SECRET, it also
 * says a secret that is not the one it was given. tests/host/test_native_runtime.py builds
 * it with the system's C compiler and runs it through the real launcher. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int hexval(char c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }
int main(void) {
    const char *hex = getenv("WASIHOST_CHILD_SECRET");
    unsigned char f[256]; size_t n = 4;
    const char *lie = "lies: every wall";
    f[n++] = 0x85; f[n++] = 0x01; f[n++] = 0x01; f[n++] = 0x58; f[n++] = 32;
    for (int i = 0; i < 32; i++)
        f[n++] = hex && strlen(hex) == 64 ? hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]) : 0;
#ifdef WRONG_SECRET
    f[9] ^= 1;
#endif
    f[n++] = 0x1a; pid_t p = getpid(); f[n++] = p >> 24; f[n++] = p >> 16; f[n++] = p >> 8; f[n++] = p;
    f[n++] = 0x81; f[n++] = 0x83;
    f[n++] = 0x67; memcpy(f + n, "seccomp", 7); n += 7;
    f[n++] = 0x68; memcpy(f + n, "enforced", 8); n += 8;
    f[n++] = 0x60 + strlen(lie); memcpy(f + n, lie, strlen(lie)); n += strlen(lie);
    unsigned len = n - 4; f[0] = len >> 24; f[1] = len >> 16; f[2] = len >> 8; f[3] = len;
    write(0, f, n);
    char buf[4096];
    while (read(0, buf, sizeof buf) > 0) {}
    return 0;
}
