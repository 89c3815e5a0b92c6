/* A dynamically linked program for the real node's test image: it prints whether the gpushare
 * interposer is mapped into it (so LD_PRELOAD took effect under the real runtime), then the
 * environment variables the device plugin owns, one per line. */
#include <stdio.h>
#include <string.h>

extern char **environ;

int main(void) {
    char line[4096];
    const char *mapped = "none";
    static char path[4096];
    FILE *maps = fopen("/proc/self/maps", "r");
    if (maps) {
        while (fgets(line, sizeof line, maps)) {
            char *lib = strstr(line, "libgpushare");
            if (lib) {
                char *start = strchr(line, '/');
                line[strcspn(line, "\n")] = 0;
                snprintf(path, sizeof path, "%s", start ? start : lib);
                mapped = path;
                break;
            }
        }
        fclose(maps);
    }
    printf("PROBE_MAPPED=%s\n", mapped);
    for (char **e = environ; *e; e++) {
        if (!strncmp(*e, "ALIYUN_COM_", 11) || !strncmp(*e, "GPUSHARE_", 9) ||
            !strncmp(*e, "NVIDIA_", 7) || !strncmp(*e, "LD_PRELOAD=", 11) ||
            !strncmp(*e, "CUDA_", 5))
            printf("%s\n", *e);
    }
    return 0;
}
