/* A dynamically linked program for the real node's test image: it prints whether the gpushare
 * interposer is mapped into it (so LD_PRELOAD took effect under the real runtime), the GPU
 * device nodes the runtime gave it (the character devices /dev/nvidia<N>, sorted by N), then
 * the environment variables the device plugin and the CDI spec own, one per line. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

extern char **environ;

static int by_number(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

/* PROBE_DEVICES=/dev/nvidia0,/dev/nvidia2: only character devices count, so a regular file
 * an image ships under that name is not mistaken for a GPU. */
static void print_devices(void) {
    int numbers[256], count = 0;
    DIR *dev = opendir("/dev");
    struct dirent *entry;
    while (dev && (entry = readdir(dev)) != NULL && count < 256) {
        char *end, path[512];
        struct stat st;
        if (strncmp(entry->d_name, "nvidia", 6) || !entry->d_name[6]) continue;
        long n = strtol(entry->d_name + 6, &end, 10);
        if (*end) continue;
        snprintf(path, sizeof path, "/dev/%s", entry->d_name);
        if (stat(path, &st) == 0 && S_ISCHR(st.st_mode)) numbers[count++] = (int)n;
    }
    if (dev) closedir(dev);
    qsort(numbers, count, sizeof numbers[0], by_number);
    printf("PROBE_DEVICES=");
    for (int i = 0; i < count; i++) printf("%s/dev/nvidia%d", i ? "," : "", numbers[i]);
    printf("\n");
}

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
    print_devices();
    for (char **e = environ; *e; e++) {
        if (!strncmp(*e, "ALIYUN_COM_", 11) || !strncmp(*e, "GPUSHARE_", 9) ||
            !strncmp(*e, "NVIDIA_", 7) || !strncmp(*e, "LD_PRELOAD=", 11) ||
            !strncmp(*e, "CUDA_", 5))
            printf("%s\n", *e);
    }
    return 0;
}
