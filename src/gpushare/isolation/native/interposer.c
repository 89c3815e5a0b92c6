/*
 * gpushare's CUDA driver / NVML interposer (LD_PRELOAD=libgpushare-cuda.so).
 *
 * Limits: read from the read-only limits file the device plugin mounts (GPUSHARE_LIMITS_FILE),
 * else from GPUSHARE_MEM_LIMIT, GPUSHARE_CORE_LIMIT and GPUSHARE_ACCOUNTING_DIR; see below.
 *
 * Memory: every driver allocation path (cuMemAlloc, pitch, async and pool, VMM cuMemCreate, CUDA
 * arrays, counted by their element size as a lower bound) is
 * reserved against the memory limit before the real call and given back on free or failure.
 * Usage is kept per container by the device plugin's accounting broker when the limits file
 * names one (version 2): one connection per process, which is that process's account (see the
 * broker section). Without it (the environment, or a version 1 file) usage is kept in a shared
 * mmap'ed table in the accounting directory, one entry per process (pid, start time, bytes per
 * device), under an exclusive flock plus a process-local mutex (flock does not exclude threads
 * of one process). Entries of dead processes are reclaimed on each reservation
 * (kill(pid, 0) == ESRCH), and before refusing, entries whose pid was reused (start time
 * differs) are reclaimed too. IPC-imported memory is counted in the exporting process (where it
 * was allocated), so it is not counted twice. Managed memory is refused.
 *
 * Resolution: the real driver and NVML are dlopen'ed (GPUSHARE_REAL_CUDA / GPUSHARE_REAL_NVML,
 * defaults libcuda.so.1 / libnvidia-ml.so.1). CUDA 11.3+ runtimes dlopen libcuda and resolve
 * entry points by handle (dlsym) and through cuGetProcAddress, which bypass LD_PRELOAD; so dlsym
 * itself is wrapped and cuGetProcAddress(_v2) hands out this library's functions for the names it
 * intercepts.
 *
 * Compute: launches (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch)
 * wait for this container's time slices of each 100 ms period. Under cGPU policies 0..4, and
 * for every core_mem container (the device plugin gives it policy 3, fixed: its computing-power
 * share as one slice), the slices come from the GPU's schedule the plugin writes; with only
 * GPUSHARE_CORE_LIMIT (no limits file naming a schedule) the container keeps to one slice of its
 * share. Time slices need no measurement: a controller fed by NVML's utilisation samples, which
 * lag their kernels by a good part of a second on a real GPU, oscillated between 10 % and 100 %
 * on an H100 (issue 37), where the slices held every share within 2.3 points.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "gpushare_cuda.h"

/*
 * Containers run older C libraries than the build host (CUDA images on Ubuntu 20.04 have glibc
 * 2.31). glibc 2.34 moved dlopen and pthread_create into libc under new symbol versions, which an
 * older ld.so refuses to preload; bind to the versions every glibc since the architecture's first
 * has (libdl.so.2 and libpthread.so.0 are linked in for those).
 */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
#if defined(__x86_64__)
#define GS_BASE_GLIBC "GLIBC_2.2.5"
#define GS_DLADDR1_GLIBC "GLIBC_2.3.3"
#elif defined(__aarch64__)
#define GS_BASE_GLIBC "GLIBC_2.17"
#define GS_DLADDR1_GLIBC "GLIBC_2.17"
#endif
#ifdef GS_BASE_GLIBC
__asm__(".symver dlopen,dlopen@" GS_BASE_GLIBC);
__asm__(".symver dlerror,dlerror@" GS_BASE_GLIBC);
__asm__(".symver dlvsym,dlvsym@" GS_BASE_GLIBC);
__asm__(".symver dladdr1,dladdr1@" GS_DLADDR1_GLIBC);
__asm__(".symver dlclose,dlclose@" GS_BASE_GLIBC);
__asm__(".symver pthread_create,pthread_create@" GS_BASE_GLIBC);
__asm__(".symver pthread_once,pthread_once@" GS_BASE_GLIBC);
#endif
#endif

#define GS_EXPORT __attribute__((visibility("default")))
#define GS_MAX_DEVS 16
#define GS_MAX_PROCS 1024
#define GS_MAGIC 0x6770757368617265ULL /* "gpushare" */
#define GS_TABLE_FILE "gpushare-usage.v1"

/* ------------------------------------------------------------------ configuration, logging */

/*
 * The limits come from GPUSHARE_LIMITS_FILE, which the device plugin writes on the host for this
 * container and mounts read-only: a process can neither change nor unset it, whereas the
 * environment is the container's own (kubelet puts the pod's env after the plugin's, and any
 * process may change it for its children). So the file, when it is there, wins; the variables
 * stay for display and for nodes whose plugin writes no file, and a disagreement is said once on
 * stderr. A file that is there but cannot be read as version 1 fails closed: every allocation is
 * refused, since running without the limit is what a tampered file would be for. The path is
 * compiled in (no variable may move it); the tests build a copy that reads elsewhere.
 *
 * Settings are read with secure_getenv: /etc/ld.so.preload loads this library into setuid
 * programs too, whose environment is the caller's to choose.
 */
#ifndef GPUSHARE_LIMITS_FILE
#define GPUSHARE_LIMITS_FILE "/etc/gpushare/limits"
#endif
#define GS_LIMITS_MAX_BYTES 4096

static int gs_log_on = -1;

static void gs_log(const char *fmt, ...) {
    if (gs_log_on < 0) {
        const char *v = secure_getenv("GPUSHARE_LOG");
        gs_log_on = v != NULL && strcmp(v, "1") == 0;
    }
    if (!gs_log_on)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gpushare[%d]: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static pthread_once_t gs_config_once = PTHREAD_ONCE_INIT;
static unsigned long long gs_limit[GS_MAX_DEVS]; /* 0 = no limit */
static int gs_any_limit;
static int gs_core_pct;          /* 0 = no throttle */
static int gs_refuse;            /* the limits file is unusable: refuse every allocation */
static char gs_accounting[1024]; /* "" = count this process alone */
#define GS_SUN_PATH 108               /* sizeof(struct sockaddr_un.sun_path) */
static char gs_broker[GS_SUN_PATH]; /* "" = no broker: count in the table (or alone) */
static int gs_policy = 5;           /* cGPU policy; 0..4 hold launches to the GPU's schedule */
static char gs_slot[33];            /* this container's name in the schedules */
static int gs_own_pct;              /* its own share, held while no schedule can be used */
static char gs_sched_dir[256];      /* where the schedule files are, one per host GPU index */
static int gs_gpus[GS_MAX_DEVS];    /* host GPU index of each limits entry */
static int gs_ngpus;
/*
 * Which limit is whose. The limits file lists one entry per GPU of the container, and names each
 * GPU by its UUID (uuids=). A CUDA ordinal says nothing about the GPU: the container chooses
 * them (CUDA_VISIBLE_DEVICES lists its GPUs in any order, by index or UUID; CUDA_DEVICE_ORDER
 * sorts them), so a container whose GPUs have different limits could move the larger limit onto
 * the other GPU. So each CUDA device the process uses is matched to its entry by the UUID the
 * driver gives for it (cuDeviceGetUuid_v2, else cuDeviceGetUuid), which stays with the GPU; a
 * device that matches no entry gets no allowance (GS_NONE: every allocation on it is refused).
 * Every per-GPU table below (limits, the broker's device numbers, the schedules) is indexed by
 * entry. Without uuids (the environment, or a file written before them) the entry is the CUDA
 * ordinal, as it always was.
 */
#define GS_NONE (-1)
static unsigned char gs_uuid[GS_MAX_DEVS][16]; /* the GPU of each entry */
static int gs_nuuids;                         /* 0: entries are CUDA ordinals */

/* "B" or "B,B,...", bytes per device ordinal: how many, or 0 when it is not that (strict: no
 * value may be 0). Digits only: no sign, space or suffix, no overflow. */
static int gs_parse_bytes(const char *p, unsigned long long out[GS_MAX_DEVS], int strict) {
    int n = 0;
    for (;;) {
        if (n == GS_MAX_DEVS)
            return 0;
        const char *start = p;
        unsigned long long v = 0;
        for (; *p >= '0' && *p <= '9'; p++) {
            unsigned int digit = (unsigned int)(*p - '0');
            if (v > (ULLONG_MAX - digit) / 10)
                return 0;
            v = v * 10 + digit;
        }
        if (p == start || (strict && v == 0))
            return 0;
        out[n++] = v;
        if (*p == '\0')
            return n;
        if (*p++ != ',')
            return 0;
    }
}

/* One value for every device ordinal. */
static void gs_spread(unsigned long long limits[GS_MAX_DEVS], int n) {
    for (int i = n == 1 ? 1 : n; i < GS_MAX_DEVS; i++)
        limits[i] = n == 1 ? limits[0] : 0;
}

struct gs_file {
    unsigned long long limit[GS_MAX_DEVS];
    int core_pct;
    char mem_text[512];
    char accounting[sizeof gs_accounting];
    char broker[sizeof gs_broker];
    int version;
    int policy;
    char slot[sizeof gs_slot];
    char sched_dir[sizeof gs_sched_dir];
    int gpus[GS_MAX_DEVS];
    int ngpus;
    int nmem;
    unsigned char uuid[GS_MAX_DEVS][16];
    int nuuids;
};

/* NVML's text of a GPU's UUID, "GPU-" and 32 lower-case hex digits grouped 8-4-4-4-12, as 16
 * bytes; 0 when it is that, -1 when not. */
static int gs_parse_uuid(const char *text, size_t len, unsigned char out[16]) {
    static const int dash[] = {8, 13, 18, 23};
    if (len != 40 || strncmp(text, "GPU-", 4) != 0)
        return -1;
    const char *hex = text + 4;
    int nibbles = 0;
    for (int i = 0, d = 0; i < 36; i++) {
        if (d < 4 && i == dash[d]) {
            if (hex[i] != '-')
                return -1;
            d++;
            continue;
        }
        int v = hex[i] >= '0' && hex[i] <= '9' ? hex[i] - '0'
                : hex[i] >= 'a' && hex[i] <= 'f' ? hex[i] - 'a' + 10
                                                  : -1;
        if (v < 0)
            return -1;
        if (nibbles % 2 == 0)
            out[nibbles / 2] = (unsigned char)(v << 4);
        else
            out[nibbles / 2] |= (unsigned char)v;
        nibbles++;
    }
    return 0;
}

static void gs_format_uuid(const unsigned char b[16], char out[41]) {
    snprintf(out, 41,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

static int gs_printable(const char *v) {
    if (*v == '\0')
        return 0;
    for (; *v != '\0'; v++)
        if ((unsigned char)*v <= ' ' || (unsigned char)*v >= 0x7f)
            return 0;
    return 1;
}

/* Parse the limits file's text (NUL-terminated, len bytes); "" when it is version 1 or 2, else
 * why not, in why. Every setting of the version is required, once, with no spaces; '#' lines are
 * comments. Version 1 names the usage table's directory (accounting_dir), version 2 the
 * accounting broker's socket (broker); neither may name the other's. */
static void gs_parse_file(char *text, size_t len, struct gs_file *f, char *why, size_t whylen) {
    enum {
        VERSION, MEM, CORE, UNIT, ACCOUNTING, BROKER, POLICY, WEIGHT, SLOT, SCHED, GPUS, UUIDS,
        NKEYS
    };
    static const char *keys[NKEYS] = {"version", "mem_limit", "core_limit", "unit",
                                      "accounting_dir", "broker", "policy", "weight",
                                      "slot", "sched_dir", "gpus", "uuids"};
    int seen[NKEYS] = {0};
    why[0] = '\0';
    if (memchr(text, '\0', len) != NULL) {
        snprintf(why, whylen, "it contains a NUL byte");
        return;
    }
    if (len == 0 || text[len - 1] != '\n') {
        snprintf(why, whylen, "it does not end with a newline (cut short?)");
        return;
    }
    int lineno = 0;
    for (char *line = text, *next; *line != '\0'; line = next) {
        next = strchr(line, '\n');
        *next++ = '\0';
        lineno++;
        if (line[0] == '#')
            continue;
        char *eq = strchr(line, '=');
        if (eq == NULL) {
            snprintf(why, whylen, "line %d is not key=value", lineno);
            return;
        }
        *eq = '\0';
        const char *key = line, *value = eq + 1;
        int k = 0;
        while (k < NKEYS && strcmp(keys[k], key) != 0)
            k++;
        if (k == NKEYS) {
            snprintf(why, whylen, "line %d: unknown setting '%.64s'", lineno, key);
            return;
        }
        if (k != VERSION && !seen[VERSION]) {
            snprintf(why, whylen, "line %d: the first setting must be the version", lineno);
            return;
        }
        if (seen[k]) {
            snprintf(why, whylen, "line %d: %s is set twice", lineno, keys[k]);
            return;
        }
        seen[k] = 1;
        if (!gs_printable(value)) {
            snprintf(why, whylen, "line %d: %s is empty or has spaces or control characters",
                     lineno, keys[k]);
            return;
        }
        if (k == VERSION) {
            if (strcmp(value, "1") != 0 && strcmp(value, "2") != 0 && strcmp(value, "3") != 0) {
                snprintf(why, whylen,
                         "version=%.32s, but this interposer reads versions 1, 2 and 3", value);
                return;
            }
            f->version = value[0] - '0';
        }
        if ((k == ACCOUNTING && f->version != 1) || (k == BROKER && f->version == 1) ||
            (k >= POLICY && k <= GPUS && f->version != 3) || (k == UUIDS && f->version == 1)) {
            snprintf(why, whylen, "line %d: %s is not a setting of version %d", lineno, keys[k],
                     f->version);
            return;
        }
        if (k == MEM) {
            int n = gs_parse_bytes(value, f->limit, 1);
            if (n == 0 || strlen(value) >= sizeof f->mem_text) {
                snprintf(why, whylen,
                         "mem_limit=%.64s is not a positive byte count, or a list of at most %d "
                         "separated by commas",
                         value, GS_MAX_DEVS);
                return;
            }
            gs_spread(f->limit, n);
            f->nmem = n;
            snprintf(f->mem_text, sizeof f->mem_text, "%s", value);
        }
        if (k == CORE) {
            unsigned long long pct[GS_MAX_DEVS];
            int zero = strcmp(value, "0") == 0;
            if (!zero && (gs_parse_bytes(value, pct, 1) != 1 || pct[0] > 100)) {
                snprintf(why, whylen, "core_limit=%.32s is not a percentage from 0 to 100", value);
                return;
            }
            f->core_pct = zero ? 0 : (int)pct[0];
        }
        if (k == ACCOUNTING) {
            if (value[0] != '/' || strlen(value) >= sizeof f->accounting) {
                snprintf(why, whylen, "accounting_dir=%.64s is not an absolute path", value);
                return;
            }
            snprintf(f->accounting, sizeof f->accounting, "%s", value);
        }
        if (k == BROKER) {
            if (value[0] != '/' || strlen(value) >= sizeof f->broker) {
                snprintf(why, whylen, "broker=%.64s is not an absolute path of at most %d bytes",
                         value, GS_SUN_PATH - 1);
                return;
            }
            snprintf(f->broker, sizeof f->broker, "%s", value);
        }
        if (k == POLICY) {
            if (strlen(value) != 1 || value[0] < '0' || value[0] > '4') {
                snprintf(why, whylen, "policy=%.32s is not a scheduled cGPU policy (0 to 4)",
                         value);
                return;
            }
            f->policy = value[0] - '0';
        }
        if (k == WEIGHT) {
            unsigned long long w[GS_MAX_DEVS];
            if (gs_parse_bytes(value, w, 1) != 1 || w[0] > 100) {
                snprintf(why, whylen, "weight=%.32s is not a whole number from 1 to 100", value);
                return;
            }
        }
        if (k == SLOT) {
            size_t n = strlen(value), i = 0;
            while (i < n && ((value[i] >= '0' && value[i] <= '9') ||
                             (value[i] >= 'a' && value[i] <= 'z') ||
                             (value[i] >= 'A' && value[i] <= 'Z')))
                i++;
            if (i != n || n >= sizeof f->slot) {
                snprintf(why, whylen, "slot=%.40s is not 1 to 32 letters or digits", value);
                return;
            }
            snprintf(f->slot, sizeof f->slot, "%s", value);
        }
        if (k == SCHED) {
            if (value[0] != '/' || strlen(value) >= sizeof f->sched_dir - 16) {
                snprintf(why, whylen, "sched_dir=%.64s is not an absolute path", value);
                return;
            }
            snprintf(f->sched_dir, sizeof f->sched_dir, "%s", value);
        }
        if (k == GPUS) {
            unsigned long long g[GS_MAX_DEVS];
            int n = gs_parse_bytes(value, g, 0);
            for (int i = 0; i < n; i++)
                if (g[i] >= 1000)
                    n = 0;
            if (n == 0) {
                snprintf(why, whylen, "gpus=%.64s is not a list of host GPU indexes", value);
                return;
            }
            for (int i = 0; i < n; i++)
                f->gpus[i] = (int)g[i];
            f->ngpus = n;
        }
        if (k == UUIDS) {
            int n = 0;
            for (const char *p = value;;) {
                size_t len = strcspn(p, ",");
                int ok = n < GS_MAX_DEVS && gs_parse_uuid(p, len, f->uuid[n]) == 0;
                for (int i = 0; ok && i < n; i++)
                    ok = memcmp(f->uuid[i], f->uuid[n], 16) != 0;
                if (!ok) {
                    n = 0;
                    break;
                }
                n++;
                if (p[len] == '\0')
                    break;
                p += len + 1;
            }
            if (n == 0) {
                snprintf(why, whylen,
                         "uuids=%.64s is not a list of at most %d distinct GPU UUIDs as NVML gives "
                         "them (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                         value, GS_MAX_DEVS);
                return;
            }
            f->nuuids = n;
        }
    }
    for (int k = 0; k < NKEYS; k++) {
        if (k == UUIDS || (k == ACCOUNTING  ? f->version != 1
                           : k == BROKER ? f->version == 1
                                         : k >= POLICY && f->version != 3))
            continue;
        if (!seen[k]) {
            snprintf(why, whylen, "%s is missing", keys[k]);
            return;
        }
    }
    if (f->nuuids > 0 && f->nmem > 1 && f->nmem != f->nuuids)
        snprintf(why, whylen, "mem_limit has %d limits but uuids names %d GPUs", f->nmem,
                 f->nuuids);
    else if (f->nuuids > 0 && f->version == 3 && f->ngpus != f->nuuids)
        snprintf(why, whylen, "gpus names %d GPUs but uuids %d", f->ngpus, f->nuuids);
}

/* 0: there is no limits file; 1: *f holds it; -1: it is there but unusable, why says why. */
static int gs_read_file(struct gs_file *f, char *why, size_t whylen) {
    int fd = open(GPUSHARE_LIMITS_FILE, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return 0;
        snprintf(why, whylen, "cannot open it: %s", strerror(errno));
        return -1;
    }
    char text[GS_LIMITS_MAX_BYTES + 1];
    size_t len = 0;
    for (;;) {
        ssize_t got = read(fd, text + len, sizeof text - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            snprintf(why, whylen, "cannot read it: %s", strerror(errno));
            close(fd);
            return -1;
        }
        if (got == 0)
            break;
        len += (size_t)got;
        if (len == sizeof text - 1) {
            snprintf(why, whylen, "it is larger than %d bytes", GS_LIMITS_MAX_BYTES);
            close(fd);
            return -1;
        }
    }
    close(fd);
    text[len] = '\0';
    memset(f, 0, sizeof *f);
    gs_parse_file(text, len, f, why, whylen);
    return why[0] == '\0' ? 1 : -1;
}

static void gs_disagree(const char *variable, const char *value, const char *setting,
                        const char *file_value) {
    fprintf(stderr,
            "gpushare: %s=%s in the environment disagrees with %s=%s in %s; the file's value is "
            "used\n",
            variable, value, setting, file_value, GPUSHARE_LIMITS_FILE);
}

static void gs_config_init(void) {
    const char *mem = secure_getenv("GPUSHARE_MEM_LIMIT");
    const char *core = secure_getenv("GPUSHARE_CORE_LIMIT");
    const char *accounting = secure_getenv("GPUSHARE_ACCOUNTING_DIR");
    unsigned long long env_limit[GS_MAX_DEVS] = {0};
    int env_n = mem != NULL && *mem != '\0' ? gs_parse_bytes(mem, env_limit, 0) : 0;
    gs_spread(env_limit, env_n);
    int env_core = 0;
    if (core != NULL && *core != '\0') {
        int v = atoi(core);
        env_core = v > 0 && v < 100 ? v : 0;
    }
    struct gs_file f;
    char why[256];
    int from_file = gs_read_file(&f, why, sizeof why);
    if (from_file < 0) {
        gs_refuse = 1;
        gs_any_limit = 1;
        fprintf(stderr,
                "gpushare: %s is unusable (%s); every GPU memory allocation is refused rather "
                "than run without the container's limit. The device plugin writes this file when "
                "the container starts: recreate the pod, and check that the device plugin and "
                "its interposer are the same version\n",
                GPUSHARE_LIMITS_FILE, why);
        return;
    }
    if (from_file) {
        if (mem != NULL && memcmp(env_limit, f.limit, sizeof env_limit) != 0)
            gs_disagree("GPUSHARE_MEM_LIMIT", mem, "mem_limit", f.mem_text);
        char pct[16];
        snprintf(pct, sizeof pct, "%d", f.core_pct);
        if (core != NULL && env_core != (f.core_pct < 100 ? f.core_pct : 0))
            gs_disagree("GPUSHARE_CORE_LIMIT", core, "core_limit", pct);
        if (f.version == 1 && accounting != NULL && strcmp(accounting, f.accounting) != 0)
            gs_disagree("GPUSHARE_ACCOUNTING_DIR", accounting, "accounting_dir", f.accounting);
        memcpy(gs_limit, f.limit, sizeof gs_limit);
        gs_core_pct = f.core_pct < 100 ? f.core_pct : 0;
        snprintf(gs_accounting, sizeof gs_accounting, "%s", f.accounting);
        snprintf(gs_broker, sizeof gs_broker, "%s", f.broker);
        if (f.version == 3) {
            gs_policy = f.policy;
            gs_core_pct = 0; /* the schedule, not the rate throttle, holds this container */
            gs_own_pct = f.core_pct > 0 ? f.core_pct : 1; /* files before it was written: 1 % */
            snprintf(gs_slot, sizeof gs_slot, "%s", f.slot);
            snprintf(gs_sched_dir, sizeof gs_sched_dir, "%s", f.sched_dir);
            memcpy(gs_gpus, f.gpus, sizeof gs_gpus);
            gs_ngpus = f.ngpus;
        }
        memcpy(gs_uuid, f.uuid, sizeof gs_uuid);
        gs_nuuids = f.nuuids;
    } else {
        if (mem != NULL && *mem != '\0' && env_n == 0)
            fprintf(stderr,
                    "gpushare: GPUSHARE_MEM_LIMIT=%s is not a byte count (or a comma-separated "
                    "list of them); no GPU memory limit is enforced\n",
                    mem);
        memcpy(gs_limit, env_limit, sizeof gs_limit);
        gs_core_pct = env_core;
        if (accounting != NULL)
            snprintf(gs_accounting, sizeof gs_accounting, "%s", accounting);
    }
    if (gs_policy >= 5)
        gs_own_pct = gs_core_pct; /* no schedule: one slice of the core limit a period */
    for (int i = 0; i < GS_MAX_DEVS; i++)
        gs_any_limit |= gs_limit[i] != 0;
    gs_log("limits from %s: memory device0=%llu bytes, core limit=%d%%, usage kept %s %s",
           from_file ? GPUSHARE_LIMITS_FILE : "the environment", gs_limit[0], gs_core_pct,
           *gs_broker ? "by the broker at" : "in", *gs_broker ? gs_broker : gs_accounting);
}

static void gs_config(void) { pthread_once(&gs_config_once, gs_config_init); }

static unsigned long long gs_limit_of(int dev) {
    gs_config();
    return dev >= 0 && dev < GS_MAX_DEVS ? gs_limit[dev] : 0;
}

/* ------------------------------------------------------------------ symbol resolution */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn gs_real_dlsym_fn;

static void *gs_real_dlsym(void *handle, const char *name) {
    if (gs_real_dlsym_fn == NULL) {
        static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
        for (size_t i = 0; i < sizeof versions / sizeof *versions && !gs_real_dlsym_fn; i++)
            gs_real_dlsym_fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        if (gs_real_dlsym_fn == NULL)
            return NULL;
    }
    return gs_real_dlsym_fn(handle, name);
}

static void *gs_cuda_handle, *gs_nvml_handle;
static pthread_mutex_t gs_resolve_lock = PTHREAD_MUTEX_INITIALIZER;

static void *gs_open(void **slot, const char *env, const char *dflt) {
    pthread_mutex_lock(&gs_resolve_lock);
    if (*slot == NULL) {
        const char *path = secure_getenv(env);
        *slot = dlopen(path != NULL && *path != '\0' ? path : dflt, RTLD_NOW | RTLD_GLOBAL);
        if (*slot == NULL)
            gs_log("cannot open %s: %s", path ? path : dflt, dlerror());
    }
    pthread_mutex_unlock(&gs_resolve_lock);
    return *slot;
}

static void *gs_real_cuda(const char *name) {
    void *h = gs_open(&gs_cuda_handle, "GPUSHARE_REAL_CUDA", "libcuda.so.1");
    return h ? gs_real_dlsym(h, name) : NULL;
}

static void *gs_real_nvml(const char *name) {
    void *h = gs_open(&gs_nvml_handle, "GPUSHARE_REAL_NVML", "libnvidia-ml.so.1");
    return h ? gs_real_dlsym(h, name) : NULL;
}

#define REAL_CUDA(type, name)                                                                  \
    static __typeof__(type) real_fn;                                                                     \
    if (real_fn == NULL)                                                                       \
        real_fn = (type)gs_real_cuda(name);                                                    \
    if (real_fn == NULL)                                                                       \
        return CUDA_ERROR_NOT_FOUND;

#define REAL_NVML(type, name)                                                                  \
    static __typeof__(type) real_fn;                                                                     \
    if (real_fn == NULL)                                                                       \
        real_fn = (type)gs_real_nvml(name);                                                    \
    if (real_fn == NULL)                                                                       \
        return NVML_ERROR_NOT_FOUND;

/* Run fn on a detached thread of this process; say so on stderr when it cannot start. */
static void gs_detached(void *(*fn)(void *), const char *what) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, fn, NULL) != 0)
        fprintf(stderr, "gpushare: cannot start the thread of %s\n", what);
    pthread_attr_destroy(&attr);
}

/* ------------------------------------------------------------------ the accounting broker */

/*
 * With a version 2 limits file, usage is not kept in the container at all: the device plugin
 * runs a broker per container, reached through a unix socket in a directory it mounts read-only
 * (connecting to a socket needs no write access to the mount). Each process opens its own
 * connection, and the connection is the account: the broker charges each reservation to it,
 * refuses one past the container's limit (the broker's copy, from the allocation), and gives
 * back everything charged to it when the connection closes, which the kernel does however the
 * process ends. So no process can lower what the others hold, and there is no pid to forge.
 *
 * Requests and answers are single ASCII lines (gpushare.isolation.accounting):
 *   reserve D B -> ok | refused USED LIMIT     release D B -> ok
 *   hold D B    -> ok   (memory held before this connection: after the broker restarted)
 *   used D      -> used USED LIMIT
 *   active D    -> ok   (this process launches on D: cGPU policies 1, 2 and 4)
 * A broker that cannot be reached within GS_BROKER_WAIT_MS fails closed: the reservation is
 * refused, as with an unusable limits file.
 */
#define GS_BROKER_WAIT_MS 5000
#define GS_BROKER_TIMEOUT_S 10

static pthread_mutex_t gs_broker_lock = PTHREAD_MUTEX_INITIALIZER;
static int gs_broker_fd = -1;
static pid_t gs_broker_pid;
static unsigned long long gs_held[GS_MAX_DEVS]; /* this process's reserved bytes */
static int gs_broker_said;

static int gs_broker_send(int fd, const char *line) {
    size_t len = strlen(line), done = 0;
    while (done < len) {
        ssize_t n = send(fd, line + done, len - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

/* One answer line, without its newline; -1 on error, timeout or a line too long. */
static int gs_broker_recv(int fd, char *buf, size_t len) {
    size_t got = 0;
    for (;;) {
        ssize_t n = recv(fd, buf + got, len - 1 - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
        buf[got] = '\0';
        char *nl = memchr(buf, '\n', got);
        if (nl != NULL) {
            *nl = '\0';
            return 0;
        }
        if (got == len - 1)
            return -1;
    }
}

static int gs_broker_exchange(int fd, const char *line, char *reply, size_t len) {
    return gs_broker_send(fd, line) == 0 ? gs_broker_recv(fd, reply, len) : -1;
}

static void gs_broker_drop(void) {
    if (gs_broker_fd >= 0)
        close(gs_broker_fd);
    gs_broker_fd = -1;
}

/* Connect (once per process; a forked child opens its own and holds nothing yet) and declare
 * what this process already holds; 0 when connected. Call with gs_broker_lock held. */
static int gs_broker_connect(void) {
    pid_t pid = getpid();
    if (gs_broker_pid != pid) {
        gs_broker_drop(); /* the parent's connection: closing our copy leaves the parent's */
        if (gs_broker_pid != 0)
            memset(gs_held, 0, sizeof gs_held);
        gs_broker_pid = pid;
    }
    if (gs_broker_fd >= 0)
        return 0;
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", gs_broker);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {GS_BROKER_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    for (int d = 0; d < GS_MAX_DEVS; d++) {
        if (gs_held[d] == 0)
            continue;
        char line[96], reply[96];
        snprintf(line, sizeof line, "hold %d %llu\n", d, gs_held[d]);
        if (gs_broker_exchange(fd, line, reply, sizeof reply) != 0 || strcmp(reply, "ok") != 0) {
            close(fd);
            return -1;
        }
    }
    gs_broker_fd = fd;
    return 0;
}

/* Ask the broker; 0 with its answer in reply, -1 when it cannot be reached in time. A broken
 * connection is reopened (the broker gave back its charges; hold declares them again) and the
 * question asked again, so only questions that change nothing before their answer may use it.
 * Call with gs_broker_lock held: what the answer changes in gs_held must be changed before any
 * other thread can reconnect and declare it. */
static int gs_broker_ask(const char *line, char *reply, size_t len, int wait_ms) {
    int rc = -1;
    for (int waited = 0;; waited += 250) {
        if (gs_broker_connect() == 0) {
            if (gs_broker_exchange(gs_broker_fd, line, reply, len) == 0) {
                rc = 0;
                break;
            }
            gs_broker_drop();
            if (gs_broker_connect() == 0 &&
                gs_broker_exchange(gs_broker_fd, line, reply, len) == 0) {
                rc = 0;
                break;
            }
            gs_broker_drop();
        }
        if (waited >= wait_ms)
            break;
        struct timespec ts = {0, 250000000L};
        nanosleep(&ts, NULL);
    }
    if (rc != 0 && !gs_broker_said) {
        gs_broker_said = 1;
        fprintf(stderr,
                "gpushare: the accounting broker at %s does not answer (%s); GPU memory "
                "allocations are refused until it does. It is the device plugin on this node: "
                "check that it runs\n",
                gs_broker, strerror(errno));
    } else if (rc == 0) {
        gs_broker_said = 0;
    }
    return rc;
}

/*
 * A process that holds memory and is idle must still say so when the broker comes back after a
 * plugin restart, or a neighbour could be given the same memory. So while a process holds any,
 * a thread of its own waits for the connection to break (POLLRDHUP: it reads nothing, the
 * answers stay for their callers), then reconnects, which declares the holdings; the restarted
 * broker delays reservations briefly for exactly this (gpushare.node.enforcement.broker).
 */
static pid_t gs_watcher_pid;

static int gs_broker_holds(void) {
    for (int d = 0; d < GS_MAX_DEVS; d++)
        if (gs_held[d] != 0)
            return 1;
    return 0;
}

static void *gs_broker_watch(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&gs_broker_lock);
        int fd = gs_broker_fd, holds = gs_broker_holds();
        if (fd < 0 && holds)
            gs_broker_connect();
        fd = gs_broker_fd;
        pthread_mutex_unlock(&gs_broker_lock);
        if (fd < 0) {
            struct timespec ts = {0, 250000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        struct pollfd p = {.fd = fd, .events = POLLRDHUP};
        if (poll(&p, 1, 1000) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            pthread_mutex_lock(&gs_broker_lock);
            if (gs_broker_fd == fd) {
                /* holding nothing, there is nothing to declare: the broker may have closed an
                 * idle connection, and the next question reconnects */
                gs_broker_drop();
                if (gs_broker_holds()) {
                    gs_log("the accounting broker closed the connection; reconnecting");
                    gs_broker_connect();
                }
            }
            pthread_mutex_unlock(&gs_broker_lock);
        }
    }
    return NULL;
}

/* Start this process's watcher once; call with gs_broker_lock held. */
static void gs_broker_watcher(void) {
    pid_t pid = getpid();
    if (gs_watcher_pid == pid) /* a forked child has no thread of its parent's */
        return;
    gs_watcher_pid = pid;
    gs_detached(gs_broker_watch, "the accounting broker's watcher");
}

static CUresult gs_broker_reserve(int dev, unsigned long long bytes) {
    char line[96], reply[96];
    snprintf(line, sizeof line, "reserve %d %llu\n", dev, bytes);
    pthread_mutex_lock(&gs_broker_lock);
    int ok = gs_broker_ask(line, reply, sizeof reply, GS_BROKER_WAIT_MS) == 0 && strcmp(reply, "ok") == 0;
    if (ok) {
        gs_held[dev] += bytes;
        gs_broker_watcher();
    }
    pthread_mutex_unlock(&gs_broker_lock);
    if (!ok)
        gs_log("refusing %llu bytes on device %d: broker says %s", bytes, dev, reply);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Not asked again after a reconnect: the new connection declared what is held without it. */
static void gs_broker_release(int dev, unsigned long long bytes) {
    pthread_mutex_lock(&gs_broker_lock);
    if (gs_broker_pid == getpid()) { /* a forked child frees nothing it reserved */
        unsigned long long give = bytes < gs_held[dev] ? bytes : gs_held[dev];
        gs_held[dev] -= give;
        char line[96], reply[96];
        snprintf(line, sizeof line, "release %d %llu\n", dev, give);
        if (give > 0 && gs_broker_fd >= 0 &&
            gs_broker_exchange(gs_broker_fd, line, reply, sizeof reply) != 0)
            gs_broker_drop(); /* the broker gave back all of it; the next connection holds less */
    }
    pthread_mutex_unlock(&gs_broker_lock);
}

static unsigned long long gs_broker_used(int dev) {
    char line[96], reply[96];
    snprintf(line, sizeof line, "used %d\n", dev);
    unsigned long long used, limit;
    pthread_mutex_lock(&gs_broker_lock);
    if (gs_broker_ask(line, reply, sizeof reply, 0) != 0 ||
        sscanf(reply, "used %llu %llu", &used, &limit) != 2)
        used = gs_held[dev]; /* this process's own, at least */
    pthread_mutex_unlock(&gs_broker_lock);
    return used;
}

/* ------------------------------------------------------------------ the shared usage table */

struct gs_proc {
    int32_t pid;
    int32_t pad;
    uint64_t start_time;
    uint64_t bytes[GS_MAX_DEVS];
};

struct gs_table {
    uint64_t magic;
    uint32_t version;
    uint32_t pad;
    struct gs_proc procs[GS_MAX_PROCS];
};

static pthread_mutex_t gs_table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_table *gs_table;
static int gs_table_fd = -1;
static pid_t gs_my_pid;
static struct gs_proc *gs_me;

static uint64_t gs_start_time(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may contain spaces */
    if (p == NULL)
        return 0;
    /* after ") " come fields 3.. ; starttime is field 22 */
    int field = 2;
    for (p++; *p != '\0' && field < 22; p++)
        if (*p == ' ')
            field++;
    return strtoull(p, NULL, 10);
}


static int gs_table_attach(void);

/* Lock the table (threads: the mutex; processes: flock) and attach; 0 when usable. */
static int gs_table_lock_acquire(void) {
    pthread_mutex_lock(&gs_table_lock);
    int rc = gs_table_attach();
    if (gs_table_fd >= 0)
        while (flock(gs_table_fd, LOCK_EX) != 0 && errno == EINTR) {
        }
    return rc;
}

static void gs_table_lock_release(void) {
    if (gs_table_fd >= 0)
        flock(gs_table_fd, LOCK_UN);
    pthread_mutex_unlock(&gs_table_lock);
}

static void gs_local_reset(void);

/* Map the table and claim this process's entry; call with gs_table_lock held (not flock). */
static int gs_table_attach(void) {
    gs_config(); /* the accounting directory */
    pid_t pid = getpid();
    if (gs_table != NULL && gs_my_pid == pid)
        return gs_me ? 0 : -1;
    if (gs_table != NULL) {
        /* forked: flock belongs to the open file description shared with the parent (and a
         * private table is the parent's copy) */
        munmap(gs_table, sizeof(struct gs_table));
        if (gs_table_fd >= 0)
            close(gs_table_fd);
        gs_table = NULL;
        gs_table_fd = -1;
    }
    if (gs_table == NULL) {
        const char *dir = gs_accounting;
        if (*dir != '\0') {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, GS_TABLE_FILE);
            mode_t old = umask(0);
            int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
            umask(old);
            if (fd >= 0) {
                flock(fd, LOCK_EX);
                off_t size = lseek(fd, 0, SEEK_END); /* not fstat: GLIBC_2.33 */
                if (size >= 0 && size < (off_t)sizeof(struct gs_table) &&
                    ftruncate(fd, sizeof(struct gs_table)) != 0) {
                    flock(fd, LOCK_UN);
                    close(fd);
                    fd = -1;
                }
                if (fd >= 0) {
                    void *m = mmap(NULL, sizeof(struct gs_table), PROT_READ | PROT_WRITE,
                                   MAP_SHARED, fd, 0);
                    flock(fd, LOCK_UN);
                    if (m == MAP_FAILED) {
                        close(fd);
                        fd = -1;
                    } else {
                        gs_table = m;
                        gs_table_fd = fd;
                    }
                }
            }
            if (gs_table == NULL)
                fprintf(stderr,
                        "gpushare: cannot use the accounting file %s (%s); counting this "
                        "process alone\n",
                        path, strerror(errno));
        }
        if (gs_table == NULL) {
            void *m = mmap(NULL, sizeof(struct gs_table), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED)
                return -1;
            gs_table = m;
        }
    }
    if (gs_my_pid != 0 && gs_my_pid != pid)
        gs_local_reset(); /* a forked child owns none of its parent's device memory */
    gs_my_pid = pid;
    gs_me = NULL;
    if (gs_table_fd >= 0)
        flock(gs_table_fd, LOCK_EX);
    if (gs_table->magic != GS_MAGIC) {
        memset(gs_table, 0, sizeof *gs_table);
        gs_table->magic = GS_MAGIC;
        gs_table->version = 1;
    }
    uint64_t start = gs_start_time(pid);
    struct gs_proc *free_slot = NULL;
    for (int i = 0; i < GS_MAX_PROCS; i++) {
        struct gs_proc *e = &gs_table->procs[i];
        if (e->pid == pid) { /* a dead process with our pid: its memory is gone */
            memset(e, 0, sizeof *e);
            free_slot = free_slot ? free_slot : e;
        } else if (e->pid == 0 && free_slot == NULL) {
            free_slot = e;
        }
    }
    if (free_slot != NULL) {
        free_slot->pid = pid;
        free_slot->start_time = start;
        gs_me = free_slot;
    }
    if (gs_table_fd >= 0)
        flock(gs_table_fd, LOCK_UN);
    return gs_me ? 0 : -1;
}

/* Reclaim dead entries; with thorough, also entries whose pid now names another process. */
static void gs_reclaim(int thorough) {
    for (int i = 0; i < GS_MAX_PROCS; i++) {
        struct gs_proc *e = &gs_table->procs[i];
        if (e->pid == 0 || e == gs_me)
            continue;
        int dead = kill(e->pid, 0) != 0 && errno == ESRCH;
        if (!dead && thorough && e->start_time != 0)
            dead = gs_start_time(e->pid) != e->start_time;
        if (dead) {
            gs_log("reclaiming entry of dead pid %d", e->pid);
            memset(e, 0, sizeof *e);
        }
    }
}

static unsigned long long gs_used_locked(int dev) {
    unsigned long long sum = 0;
    for (int i = 0; i < GS_MAX_PROCS; i++)
        if (gs_table->procs[i].pid != 0)
            sum += gs_table->procs[i].bytes[dev];
    return sum;
}

/* Container usage of a device in bytes. */
static unsigned long long gs_used(int dev) {
    if (dev < 0 || dev >= GS_MAX_DEVS)
        return 0;
    gs_config();
    if (*gs_broker != '\0')
        return gs_broker_used(dev);
    unsigned long long used = 0;
    if (gs_table_lock_acquire() == 0) {
        gs_reclaim(0);
        used = gs_used_locked(dev);
    }
    gs_table_lock_release();
    return used;
}

/* Reserve bytes on dev for this process; CUDA_ERROR_OUT_OF_MEMORY if over the limit. */
static CUresult gs_reserve(int dev, unsigned long long bytes) {
    unsigned long long limit = gs_limit_of(dev);
    if (gs_refuse || dev == GS_NONE)
        return CUDA_ERROR_OUT_OF_MEMORY; /* said once on stderr, with the reason */
    if (limit == 0)
        return CUDA_SUCCESS;
    if (*gs_broker != '\0')
        return gs_broker_reserve(dev, bytes);
    CUresult rc = CUDA_SUCCESS;
    if (gs_table_lock_acquire() != 0) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        gs_reclaim(0);
        unsigned long long used = gs_used_locked(dev);
        if (used + bytes > limit) {
            gs_reclaim(1);
            used = gs_used_locked(dev);
        }
        if (used + bytes > limit) {
            gs_log("refusing %llu bytes on device %d: %llu used of %llu", bytes, dev, used, limit);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            gs_me->bytes[dev] += bytes;
        }
    }
    gs_table_lock_release();
    return rc;
}

static void gs_unreserve(int dev, unsigned long long bytes) {
    if (gs_limit_of(dev) == 0)
        return;
    if (*gs_broker != '\0') {
        gs_broker_release(dev, bytes);
        return;
    }
    if (gs_table_lock_acquire() == 0)
        gs_me->bytes[dev] -= bytes < gs_me->bytes[dev] ? bytes : gs_me->bytes[dev];
    gs_table_lock_release();
}

/* ------------------------------------------------------------------ process-local allocations */

enum { GS_PTR = 1, GS_VMM = 2, GS_ARRAY = 3 };

struct gs_alloc {
    unsigned long long key;
    unsigned long long bytes;
    int kind;
    int dev;
    struct gs_alloc *next;
};

#define GS_BUCKETS 4096
static struct gs_alloc *gs_buckets[GS_BUCKETS];
static pthread_mutex_t gs_alloc_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t gs_bucket(unsigned long long key) { return (size_t)((key >> 8) ^ (key >> 20)) % GS_BUCKETS; }

static void gs_local_reset(void) {
    pthread_mutex_lock(&gs_alloc_lock);
    for (size_t i = 0; i < GS_BUCKETS; i++) {
        while (gs_buckets[i] != NULL) {
            struct gs_alloc *a = gs_buckets[i];
            gs_buckets[i] = a->next;
            free(a);
        }
    }
    pthread_mutex_unlock(&gs_alloc_lock);
}

static void gs_remember(int kind, unsigned long long key, int dev, unsigned long long bytes) {
    struct gs_alloc *a = malloc(sizeof *a);
    if (a == NULL)
        return;
    a->key = key;
    a->kind = kind;
    a->dev = dev;
    a->bytes = bytes;
    pthread_mutex_lock(&gs_alloc_lock);
    size_t b = gs_bucket(key);
    a->next = gs_buckets[b];
    gs_buckets[b] = a;
    pthread_mutex_unlock(&gs_alloc_lock);
}

/* Forget an allocation and give its bytes back. */
static void gs_forget(int kind, unsigned long long key) {
    pthread_mutex_lock(&gs_alloc_lock);
    struct gs_alloc **pp = &gs_buckets[gs_bucket(key)], *found = NULL;
    for (; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->key == key && (*pp)->kind == kind) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&gs_alloc_lock);
    if (found != NULL) {
        gs_unreserve(found->dev, found->bytes);
        free(found);
    }
}

/* The entries' UUIDs as the file names them, for messages. */
static void gs_uuid_list(char *out, size_t len) {
    out[0] = '\0';
    for (int i = 0; i < gs_nuuids; i++) {
        char one[41];
        gs_format_uuid(gs_uuid[i], one);
        size_t used = strlen(out);
        snprintf(out + used, len - used, "%s%s", i ? "," : "", one);
    }
}

/* The container's entry whose GPU has the UUID want; GS_NONE when none has. */
static int gs_entry_of_uuid(const unsigned char want[16]) {
    for (int i = 0; i < gs_nuuids; i++)
        if (memcmp(gs_uuid[i], want, 16) == 0)
            return i;
    return GS_NONE;
}

static int gs_entry_known[GS_MAX_DEVS]; /* per CUDA device: entry + 1, or GS_NONE; 0: not yet */
static int gs_entry_said[GS_MAX_DEVS];

/* The limits entry of CUDA device dev: by its UUID when the limits file names UUIDs, else its
 * ordinal (out of range: no limit, as before). */
static int gs_entry(CUdevice dev) {
    gs_config();
    if (gs_nuuids == 0)
        return dev >= 0 && dev < GS_MAX_DEVS ? dev : GS_MAX_DEVS;
    int cached = dev >= 0 && dev < GS_MAX_DEVS;
    if (cached) {
        int known = __atomic_load_n(&gs_entry_known[dev], __ATOMIC_ACQUIRE);
        if (known != 0)
            return known > 0 ? known - 1 : GS_NONE;
    }
    typedef CUresult (*fn_t)(CUuuid *, CUdevice);
    static fn_t get;
    if (get == NULL)
        get = (fn_t)gs_real_cuda("cuDeviceGetUuid_v2");
    if (get == NULL)
        get = (fn_t)gs_real_cuda("cuDeviceGetUuid");
    CUuuid uuid;
    CUresult rc = get != NULL ? get(&uuid, dev) : CUDA_ERROR_NOT_FOUND;
    int entry = rc == CUDA_SUCCESS ? gs_entry_of_uuid((const unsigned char *)uuid.bytes) : GS_NONE;
    if (cached && rc == CUDA_SUCCESS)
        __atomic_store_n(&gs_entry_known[dev], entry >= 0 ? entry + 1 : GS_NONE, __ATOMIC_RELEASE);
    int say = entry == GS_NONE &&
              (!cached || !__atomic_exchange_n(&gs_entry_said[dev], 1, __ATOMIC_ACQ_REL));
    if (say) {
        char list[GS_MAX_DEVS * 41 + 1], seen[41] = "";
        gs_uuid_list(list, sizeof list);
        if (rc == CUDA_SUCCESS)
            gs_format_uuid((const unsigned char *)uuid.bytes, seen);
        fprintf(stderr,
                "gpushare: CUDA device %d is %s%s, none of this container's GPUs in %s "
                "(uuids=%s); every GPU memory allocation on it is refused. The device plugin "
                "gave the container those GPUs: use them (CUDA_VISIBLE_DEVICES may list them in "
                "any order)\n",
                (int)dev, rc == CUDA_SUCCESS ? seen : "a GPU whose UUID the driver does not give",
                rc == CUDA_SUCCESS ? "" : " (cuDeviceGetUuid failed)", GPUSHARE_LIMITS_FILE, list);
    }
    return entry;
}

/* The limits entry of the current context's device. Without a context (the driver refuses the
 * call anyway): device 0 by ordinal, no entry by UUID, with nothing said. */
static int gs_current_device(void) {
    typedef CUresult (*fn_t)(CUdevice *);
    static fn_t get;
    if (get == NULL)
        get = (fn_t)gs_real_cuda("cuCtxGetDevice");
    CUdevice dev = 0;
    if (get == NULL || get(&dev) != CUDA_SUCCESS) {
        gs_config();
        return gs_nuuids > 0 ? GS_NONE : 0;
    }
    return gs_entry(dev);
}

/* ------------------------------------------------------------------ memory entry points */

/* After the real call: on success remember the allocation (the handle is read only then), on
 * failure give the reservation back; either way the driver's answer goes to the caller. */
#define GS_SETTLE(rc, kind, handle, dev, bytes)                                                 \
    ((rc) == CUDA_SUCCESS ? (gs_remember((kind), (handle), (dev), (bytes)), (rc))               \
                          : (gs_unreserve((dev), (bytes)), (rc)))

GS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    REAL_CUDA(CUresult(*)(CUdeviceptr *, size_t), "cuMemAlloc_v2");
    int dev = gs_current_device();
    if (gs_reserve(dev, bytesize) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_fn(dptr, bytesize);
    return GS_SETTLE(rc, GS_PTR, *dptr, dev, bytesize);
}

GS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                      size_t height, unsigned int elementSizeBytes) {
    REAL_CUDA(CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int),
              "cuMemAllocPitch_v2");
    int dev = gs_current_device();
    unsigned long long want = (unsigned long long)width * height;
    if (gs_reserve(dev, want) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_fn(dptr, pitch, width, height, elementSizeBytes);
    if (rc != CUDA_SUCCESS) {
        gs_unreserve(dev, want);
        return rc;
    }
    unsigned long long got = (unsigned long long)*pitch * height;
    if (got > want && gs_reserve(dev, got - want) != CUDA_SUCCESS) {
        typedef CUresult (*free_t)(CUdeviceptr);
        free_t real_free = (free_t)gs_real_cuda("cuMemFree_v2");
        if (real_free != NULL)
            real_free(*dptr);
        gs_unreserve(dev, want);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    gs_remember(GS_PTR, *dptr, dev, got > want ? got : want);
    return rc;
}

#define GS_ASYNC_ALLOC(NAME, REALNAME)                                                         \
    GS_EXPORT CUresult NAME(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {             \
        REAL_CUDA(CUresult(*)(CUdeviceptr *, size_t, CUstream), REALNAME);                     \
        int dev = gs_current_device();                                                         \
        if (gs_reserve(dev, bytesize) != CUDA_SUCCESS)                                         \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                   \
        CUresult rc = real_fn(dptr, bytesize, stream);                                         \
        return GS_SETTLE(rc, GS_PTR, *dptr, dev, bytesize);                                    \
    }
GS_ASYNC_ALLOC(cuMemAllocAsync, "cuMemAllocAsync")
GS_ASYNC_ALLOC(cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz")

#define GS_POOL_ALLOC(NAME, REALNAME)                                                          \
    GS_EXPORT CUresult NAME(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,             \
                            CUstream stream) {                                                 \
        REAL_CUDA(CUresult(*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream), REALNAME);       \
        int dev = gs_current_device();                                                         \
        if (gs_reserve(dev, bytesize) != CUDA_SUCCESS)                                         \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                   \
        CUresult rc = real_fn(dptr, bytesize, pool, stream);                                   \
        return GS_SETTLE(rc, GS_PTR, *dptr, dev, bytesize);                                    \
    }
GS_POOL_ALLOC(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync")
GS_POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync_ptsz")

GS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    REAL_CUDA(CUresult(*)(CUdeviceptr), "cuMemFree_v2");
    CUresult rc = real_fn(dptr);
    if (rc == CUDA_SUCCESS)
        gs_forget(GS_PTR, dptr);
    return rc;
}

#define GS_ASYNC_FREE(NAME, REALNAME)                                                          \
    GS_EXPORT CUresult NAME(CUdeviceptr dptr, CUstream stream) {                               \
        REAL_CUDA(CUresult(*)(CUdeviceptr, CUstream), REALNAME);                               \
        CUresult rc = real_fn(dptr, stream);                                                   \
        if (rc == CUDA_SUCCESS)                                                                \
            gs_forget(GS_PTR, dptr);                                                           \
        return rc;                                                                             \
    }
GS_ASYNC_FREE(cuMemFreeAsync, "cuMemFreeAsync")
GS_ASYNC_FREE(cuMemFreeAsync_ptsz, "cuMemFreeAsync_ptsz")

GS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags) {
    REAL_CUDA(CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long),
              "cuMemCreate");
    int dev = prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                  ? gs_entry(prop->location.id)
                  : gs_current_device();
    if (gs_reserve(dev, size) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_fn(handle, size, prop, flags);
    return GS_SETTLE(rc, GS_VMM, *handle, dev, size);
}

GS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REAL_CUDA(CUresult(*)(CUmemGenericAllocationHandle), "cuMemRelease");
    CUresult rc = real_fn(handle);
    if (rc == CUDA_SUCCESS)
        gs_forget(GS_VMM, handle);
    return rc;
}

/* Bytes of a CUDA array: a lower bound (the driver pads and aligns), by element format. */
static unsigned long long gs_array_bytes(size_t w, size_t h, size_t d, int format,
                                         unsigned int channels) {
    unsigned long long elem;
    switch (format) {
    case 0x01: /* UNSIGNED_INT8 */
    case 0x08: /* SIGNED_INT8 */
        elem = 1;
        break;
    case 0x02: /* UNSIGNED_INT16 */
    case 0x09: /* SIGNED_INT16 */
    case 0x10: /* HALF */
        elem = 2;
        break;
    default: /* 32-bit formats, and newer ones counted as 32-bit */
        elem = 4;
    }
    return (unsigned long long)w * (h ? h : 1) * (d ? d : 1) * (channels ? channels : 1) * elem;
}

GS_EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc) {
    REAL_CUDA(CUresult(*)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *), "cuArrayCreate_v2");
    if (desc == NULL)
        return real_fn(array, desc);
    int dev = gs_current_device();
    unsigned long long bytes =
        gs_array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    if (gs_reserve(dev, bytes) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_fn(array, desc);
    return GS_SETTLE(rc, GS_ARRAY, (unsigned long long)(uintptr_t)*array, dev, bytes);
}

GS_EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    REAL_CUDA(CUresult(*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *), "cuArray3DCreate_v2");
    if (desc == NULL)
        return real_fn(array, desc);
    int dev = gs_current_device();
    unsigned long long bytes =
        gs_array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
    if (gs_reserve(dev, bytes) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_fn(array, desc);
    return GS_SETTLE(rc, GS_ARRAY, (unsigned long long)(uintptr_t)*array, dev, bytes);
}

GS_EXPORT CUresult cuArrayDestroy(CUarray array) {
    REAL_CUDA(CUresult(*)(CUarray), "cuArrayDestroy");
    CUresult rc = real_fn(array);
    if (rc == CUDA_SUCCESS)
        gs_forget(GS_ARRAY, (unsigned long long)(uintptr_t)array);
    return rc;
}

GS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    REAL_CUDA(CUresult(*)(CUdeviceptr *, size_t, unsigned int), "cuMemAllocManaged");
    gs_config();
    if (gs_any_limit) {
        fprintf(stderr,
                "gpushare: managed memory (cuMemAllocManaged) is not allowed under a GPU memory "
                "limit (GPUSHARE_MEM_LIMIT); allocate with cudaMalloc/cuMemAlloc instead\n");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return real_fn(dptr, bytesize, flags);
}

GS_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    REAL_CUDA(CUresult(*)(size_t *, size_t *), "cuMemGetInfo_v2");
    size_t real_free = 0, real_total = 0;
    CUresult rc = real_fn(&real_free, &real_total);
    if (rc != CUDA_SUCCESS)
        return rc;
    int dev = gs_current_device();
    unsigned long long limit = gs_limit_of(dev);
    if (gs_refuse || dev == GS_NONE) {
        *free_bytes = 0;
        *total_bytes = real_total;
        return rc;
    }
    if (limit == 0) {
        *free_bytes = real_free;
        *total_bytes = real_total;
        return rc;
    }
    unsigned long long used = gs_used(dev);
    unsigned long long left = used < limit ? limit - used : 0;
    *free_bytes = left < real_free ? left : real_free;
    *total_bytes = limit < real_total ? limit : real_total;
    return rc;
}

GS_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    REAL_CUDA(CUresult(*)(size_t *, CUdevice), "cuDeviceTotalMem_v2");
    CUresult rc = real_fn(bytes, dev);
    unsigned long long limit = rc == CUDA_SUCCESS ? gs_limit_of(gs_entry(dev)) : 0;
    if (rc == CUDA_SUCCESS && limit != 0 && limit < *bytes)
        *bytes = limit;
    return rc;
}

/* ------------------------------------------------------------------ NVML memory */

/* The limits entry of an NVML device: by its UUID when the limits file names UUIDs (NVML's
 * indexes are the GPUs', not CUDA's ordinals), else its index; GS_NONE when neither is known. */
static int gs_nvml_index(nvmlDevice_t device) {
    gs_config();
    if (gs_nuuids > 0) {
        typedef nvmlReturn_t (*uuid_fn_t)(nvmlDevice_t, char *, unsigned int);
        static uuid_fn_t get_uuid;
        if (get_uuid == NULL)
            get_uuid = (uuid_fn_t)gs_real_nvml("nvmlDeviceGetUUID");
        char text[96];
        unsigned char uuid[16];
        if (get_uuid == NULL || get_uuid(device, text, sizeof text) != NVML_SUCCESS ||
            gs_parse_uuid(text, strlen(text), uuid) != 0)
            return GS_NONE;
        return gs_entry_of_uuid(uuid);
    }
    typedef nvmlReturn_t (*fn_t)(nvmlDevice_t, unsigned int *);
    static fn_t get;
    if (get == NULL)
        get = (fn_t)gs_real_nvml("nvmlDeviceGetIndex");
    unsigned int index = 0;
    if (get == NULL || get(device, &index) != NVML_SUCCESS)
        return GS_NONE;
    return (int)index;
}

/* The container's view of a device whose real total is *total: the limit as the total, the
 * container's usage as used. 0 (leave NVML's answer alone) when the device has no limit, or a
 * limit above the GPU's memory, which is no limit. */
static int gs_nvml_view(nvmlDevice_t device, unsigned long long *total, unsigned long long *used,
                        unsigned long long *free_bytes) {
    int dev = gs_nvml_index(device);
    unsigned long long limit = gs_limit_of(dev);
    if (limit == 0 || limit >= *total)
        return 0;
    unsigned long long usage = gs_used(dev);
    *total = limit;
    *used = usage < limit ? usage : limit;
    *free_bytes = limit - *used;
    return 1;
}

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    REAL_NVML(nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *), "nvmlDeviceGetMemoryInfo");
    nvmlReturn_t rc = real_fn(device, memory);
    if (rc == NVML_SUCCESS)
        gs_nvml_view(device, &memory->total, &memory->used, &memory->free);
    return rc;
}

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    REAL_NVML(nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *), "nvmlDeviceGetMemoryInfo_v2");
    nvmlReturn_t rc = real_fn(device, memory);
    if (rc == NVML_SUCCESS && gs_nvml_view(device, &memory->total, &memory->used, &memory->free))
        memory->reserved = 0;
    return rc;
}

/* ------------------------------------------------------------------ time slices */

static uint64_t gs_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------ cGPU policy schedule */

/*
 * Policies 0..4 (limits file version 3): the device plugin writes one schedule per host GPU,
 * <sched_dir>/gpu<index>, in a host directory mounted read-only: a period, an epoch on
 * CLOCK_MONOTONIC (one clock for the whole host, containers included) and slots
 * "slot=<owner>,<start_ns>,<length_ns>", owner "*" being policy 4's open window. A launch waits
 * until the current offset in the period lies in one of this container's slots (or the open
 * window). The file is re-read at most every 100 ms, so a new member or a changed share takes
 * effect within one period.
 *
 * A missing or unreadable schedule, or one that gives this container no time, is said once, and
 * until it can be used the container keeps to its own share (core_limit of a version 3 limits
 * file: what the policy is sure to give it on a full GPU), in one window of each 100 ms period
 * placed by its slot name. It never launches unscheduled: the plugin writes the file before the
 * container starts and the container cannot write it, so a file that is not there is a volume
 * of the pod's own over the schedule directory, or damage, and neither is a reason to give the
 * container the whole GPU.
 *
 * Policies 1, 2 and 4 share the GPU among the containers launching now. Each process says so
 * on its own broker connection, "active <device>", at most every GS_ACTIVE_NS while it
 * launches; the plugin writes the schedule before it answers, so a container that was idle
 * (and so has no slot) reads a schedule naming it as soon as the answer comes. A broker that
 * cannot be reached only costs the report: launches keep to the schedule as it is.
 */
#define GS_ACTIVE_NS 50000000ULL
#define GS_SCHED_SLOTS 64
struct gs_sched {
    pthread_mutex_t lock;
    uint64_t loaded_ns;
    int usable;
    long long period, epoch;
    int n;
    long long start[GS_SCHED_SLOTS], len[GS_SCHED_SLOTS];
    int said;
    int own;              /* slots the last load gave this container by name (not the open window) */
    uint64_t reported_ns; /* last activity report to the broker */
    uint64_t last_launch_ns;
    double gap_ns; /* average time between this process's launches while it may launch */
};
static struct gs_sched gs_scheds[GS_MAX_DEVS + 1]; /* the last: a device of no entry (GS_NONE) */
static pthread_once_t gs_sched_once = PTHREAD_ONCE_INIT;

static void gs_sched_init(void) {
    for (int d = 0; d <= GS_MAX_DEVS; d++)
        pthread_mutex_init(&gs_scheds[d].lock, NULL);
}

/* Re-read the schedule of host GPU host; sets why when it cannot be used. */
static void gs_sched_load(struct gs_sched *s, int host, char *why, size_t whylen) {
    char path[sizeof gs_sched_dir + 24];
    snprintf(path, sizeof path, "%s/gpu%d", gs_sched_dir, host);
    s->usable = 0;
    s->n = 0;
    s->own = 0;
    why[0] = '\0';
    FILE *fp = fopen(path, "re");
    if (fp == NULL) {
        snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
        return;
    }
    char line[160];
    int version = 0;
    s->period = 0;
    while (fgets(line, sizeof line, fp) != NULL) {
        char owner[40];
        long long a, b;
        if (line[0] == '#')
            continue;
        if (sscanf(line, "version=%d", &version) == 1)
            continue;
        if (sscanf(line, "period_ns=%lld", &a) == 1)
            s->period = a;
        else if (sscanf(line, "epoch_ns=%lld", &a) == 1)
            s->epoch = a;
        else if (sscanf(line, "slot=%39[^,],%lld,%lld", owner, &a, &b) == 3) {
            if ((strcmp(owner, gs_slot) == 0 || strcmp(owner, "*") == 0) && s->n < GS_SCHED_SLOTS &&
                a >= 0 && b > 0) {
                s->start[s->n] = a;
                s->len[s->n] = b;
                s->own += owner[0] != '*';
                s->n++;
            }
        }
    }
    fclose(fp);
    if (version != 1 || s->period <= 0)
        snprintf(why, whylen, "%s is not a version 1 schedule with a period", path);
    else if (s->n == 0)
        snprintf(why, whylen, "%s gives this container (slot %s) no time", path, gs_slot);
    else
        s->usable = 1;
}

#define GS_OWN_PERIOD_NS 100000000LL
/* Without a usable schedule: this container's own share, one window a period. The window's place
 * comes from the slot name, so containers that all lost their schedule mostly miss each other. */
static void gs_sched_own(struct gs_sched *s) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *c = gs_slot; *c != '\0'; c++)
        h = (h ^ (unsigned char)*c) * 16777619u;
    long long len = GS_OWN_PERIOD_NS * gs_own_pct / 100;
    s->period = GS_OWN_PERIOD_NS;
    s->epoch = 0;
    s->n = 1;
    s->start[0] = len < GS_OWN_PERIOD_NS ? (long long)(h % (uint32_t)(GS_OWN_PERIOD_NS - len)) : 0;
    s->len[0] = len;
    s->own = 0;
}

/* Tell the broker this container launches on the GPU of limits entry dev; 0 when it answered
 * ok. */
static int gs_sched_report(int dev) {
    char line[32], reply[96];
    snprintf(line, sizeof line, "active %d\n", dev);
    pthread_mutex_lock(&gs_broker_lock);
    int rc = -1;
    if (gs_broker[0] != '\0' && gs_broker_connect() == 0) {
        if (gs_broker_exchange(gs_broker_fd, line, reply, sizeof reply) == 0)
            rc = strcmp(reply, "ok") == 0 ? 0 : -1;
        else
            gs_broker_drop(); /* what it held is declared again by the next connection */
    }
    pthread_mutex_unlock(&gs_broker_lock);
    return rc;
}

/* Wait until this container may launch on the device of limits entry dev. Policy 5 with a core
 * limit (no schedule named), and a device of none of the container's entries: its own share,
 * one slice a period, kept for good. */
static void gs_sched_gate(int dev) {
    int none = dev == GS_NONE;
    if (!none && (dev < 0 || dev >= (gs_policy < 5 ? gs_ngpus : GS_MAX_DEVS)))
        return;
    pthread_once(&gs_sched_once, gs_sched_init);
    struct gs_sched *s = &gs_scheds[none ? GS_MAX_DEVS : dev];
    if (!none && (gs_policy == 1 || gs_policy == 2 || gs_policy == 4)) {
        uint64_t now = gs_now_ns();
        pthread_mutex_lock(&s->lock);
        int due = s->reported_ns == 0 || now - s->reported_ns >= GS_ACTIVE_NS;
        if (due)
            s->reported_ns = now;
        pthread_mutex_unlock(&s->lock);
        if (due && gs_sched_report(dev) == 0) {
            pthread_mutex_lock(&s->lock);
            if (!s->own)
                s->loaded_ns = 0; /* idle until now: the answer came after the plugin named us */
            pthread_mutex_unlock(&s->lock);
        }
    }
    for (;;) {
        uint64_t now = gs_now_ns();
        long long wait = 0;
        char why[384];
        why[0] = '\0';
        pthread_mutex_lock(&s->lock);
        if (gs_policy >= 5 || none) {
            if (s->n == 0)
                gs_sched_own(s);
        } else if (s->loaded_ns == 0 || now - s->loaded_ns > 100000000ULL) {
            gs_sched_load(s, gs_gpus[dev], why, sizeof why);
            s->loaded_ns = now;
            if (why[0] != '\0' && !s->said) {
                s->said = 1;
                fprintf(stderr,
                        "gpushare: cGPU policy %d: %s; launches on device %d keep to this "
                        "container's own share, %d %% of each 100 ms, until the schedule can be "
                        "used\n",
                        gs_policy, why, dev, gs_own_pct);
            }
            if (!s->usable)
                gs_sched_own(s);
        }
        long long t = ((long long)now - s->epoch) % s->period;
        if (t < 0)
            t += s->period;
        wait = -1;
        for (int i = 0; i < s->n; i++) {
            long long w;
            /* Launches queue up: stop early enough for the queued work to end in the slot.
             * A launcher kept waiting by the driver's full queue launches once per kernel,
             * so twice its launch interval covers the queue the fake driver (and a GPU
             * running long kernels) holds. */
            long long guard = (long long)(2 * s->gap_ns);
            if (guard > s->len[i] / 4)
                guard = s->len[i] / 4;
            if (t >= s->start[i] && t < s->start[i] + s->len[i] - guard) {
                wait = 0;
                if (s->last_launch_ns != 0 && now - s->last_launch_ns < (uint64_t)s->len[i]) {
                    double gap = (double)(now - s->last_launch_ns);
                    s->gap_ns = s->gap_ns > 0 ? 0.8 * s->gap_ns + 0.2 * gap : gap;
                }
                s->last_launch_ns = now;
                break;
            }
            w = s->start[i] > t ? s->start[i] - t : s->start[i] + s->period - t;
            if (wait < 0 || w < wait)
                wait = w;
        }
        pthread_mutex_unlock(&s->lock);
        if (wait <= 0)
            return;
        struct timespec ts = {(time_t)(wait / 1000000000LL), (long)(wait % 1000000000LL)};
        nanosleep(&ts, NULL);
    }
}

/* Hold a launch to this container's time slices on the current device. */
static void gs_throttle(void) {
    gs_config();
    if (gs_policy < 5 || gs_core_pct > 0)
        gs_sched_gate(gs_current_device());
}

#define GS_LAUNCH(NAME, REALNAME)                                                              \
    GS_EXPORT CUresult NAME(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,   \
                            unsigned int bx, unsigned int by, unsigned int bz,                 \
                            unsigned int shmem, CUstream stream, void **params,                \
                            void **extra) {                                                    \
        REAL_CUDA(CUresult(*)(CUfunction, unsigned int, unsigned int, unsigned int,            \
                              unsigned int, unsigned int, unsigned int, unsigned int,          \
                              CUstream, void **, void **),                                     \
                  REALNAME);                                                                   \
        gs_throttle();                                                                         \
        return real_fn(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);               \
    }
GS_LAUNCH(cuLaunchKernel, "cuLaunchKernel")
GS_LAUNCH(cuLaunchKernel_ptsz, "cuLaunchKernel_ptsz")

#define GS_LAUNCH_EX(NAME, REALNAME)                                                           \
    GS_EXPORT CUresult NAME(const CUlaunchConfig *config, CUfunction f, void **params,         \
                            void **extra) {                                                    \
        REAL_CUDA(CUresult(*)(const CUlaunchConfig *, CUfunction, void **, void **), REALNAME); \
        gs_throttle();                                                                         \
        return real_fn(config, f, params, extra);                                              \
    }
GS_LAUNCH_EX(cuLaunchKernelEx, "cuLaunchKernelEx")
GS_LAUNCH_EX(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx_ptsz")

#define GS_LAUNCH_COOP(NAME, REALNAME)                                                         \
    GS_EXPORT CUresult NAME(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,   \
                            unsigned int bx, unsigned int by, unsigned int bz,                 \
                            unsigned int shmem, CUstream stream, void **params) {              \
        REAL_CUDA(CUresult(*)(CUfunction, unsigned int, unsigned int, unsigned int,            \
                              unsigned int, unsigned int, unsigned int, unsigned int,          \
                              CUstream, void **),                                              \
                  REALNAME);                                                                   \
        gs_throttle();                                                                         \
        return real_fn(f, gx, gy, gz, bx, by, bz, shmem, stream, params);                      \
    }
GS_LAUNCH_COOP(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel")
GS_LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel_ptsz")

/* A CUDA graph launch waits for a slice as one kernel does. */
#define GS_GRAPH(NAME, REALNAME)                                                               \
    GS_EXPORT CUresult NAME(CUgraphExec graph, CUstream stream) {                              \
        REAL_CUDA(CUresult(*)(CUgraphExec, CUstream), REALNAME);                               \
        gs_throttle();                                                                         \
        return real_fn(graph, stream);                                                         \
    }
GS_GRAPH(cuGraphLaunch, "cuGraphLaunch")
GS_GRAPH(cuGraphLaunch_ptsz, "cuGraphLaunch_ptsz")

/* ------------------------------------------------------------------ cuGetProcAddress, dlsym */

struct gs_sym {
    const char *name; /* as asked for (base name or exact symbol) */
    void *fn;
    void *fn_ptsz; /* per-thread default stream variant, or NULL */
    int v1_name;   /* a base name whose exported symbol has the 32-bit v1 ABI */
};

static const struct gs_sym gs_syms[] = {
    {"cuMemAlloc", (void *)cuMemAlloc_v2, NULL, 1},
    {"cuMemAlloc_v2", (void *)cuMemAlloc_v2, NULL, 0},
    {"cuMemAllocPitch", (void *)cuMemAllocPitch_v2, NULL, 1},
    {"cuMemAllocPitch_v2", (void *)cuMemAllocPitch_v2, NULL, 0},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz, 0},
    {"cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz, NULL, 0},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync,
     (void *)cuMemAllocFromPoolAsync_ptsz, 0},
    {"cuMemAllocFromPoolAsync_ptsz", (void *)cuMemAllocFromPoolAsync_ptsz, NULL, 0},
    {"cuMemFree", (void *)cuMemFree_v2, NULL, 1},
    {"cuMemFree_v2", (void *)cuMemFree_v2, NULL, 0},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz, 0},
    {"cuMemFreeAsync_ptsz", (void *)cuMemFreeAsync_ptsz, NULL, 0},
    {"cuMemCreate", (void *)cuMemCreate, NULL, 0},
    {"cuMemRelease", (void *)cuMemRelease, NULL, 0},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged, NULL, 0},
    {"cuArrayCreate", (void *)cuArrayCreate_v2, NULL, 1},
    {"cuArrayCreate_v2", (void *)cuArrayCreate_v2, NULL, 0},
    {"cuArray3DCreate", (void *)cuArray3DCreate_v2, NULL, 1},
    {"cuArray3DCreate_v2", (void *)cuArray3DCreate_v2, NULL, 0},
    {"cuArrayDestroy", (void *)cuArrayDestroy, NULL, 0},
    {"cuMemGetInfo", (void *)cuMemGetInfo_v2, NULL, 1},
    {"cuMemGetInfo_v2", (void *)cuMemGetInfo_v2, NULL, 0},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem_v2, NULL, 1},
    {"cuDeviceTotalMem_v2", (void *)cuDeviceTotalMem_v2, NULL, 0},
    {"cuLaunchKernel", (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz, 0},
    {"cuLaunchKernel_ptsz", (void *)cuLaunchKernel_ptsz, NULL, 0},
    {"cuLaunchKernelEx", (void *)cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz, 0},
    {"cuLaunchKernelEx_ptsz", (void *)cuLaunchKernelEx_ptsz, NULL, 0},
    {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel,
     (void *)cuLaunchCooperativeKernel_ptsz, 0},
    {"cuLaunchCooperativeKernel_ptsz", (void *)cuLaunchCooperativeKernel_ptsz, NULL, 0},
    {"cuGraphLaunch", (void *)cuGraphLaunch, (void *)cuGraphLaunch_ptsz, 0},
    {"cuGraphLaunch_ptsz", (void *)cuGraphLaunch_ptsz, NULL, 0},
    {"cuGetProcAddress", (void *)cuGetProcAddress_v2, NULL, 0}, /* see gs_substitute */
    {"cuGetProcAddress_v2", (void *)cuGetProcAddress_v2, NULL, 0},
    {"nvmlDeviceGetMemoryInfo", (void *)nvmlDeviceGetMemoryInfo, NULL, 0},
    {"nvmlDeviceGetMemoryInfo_v2", (void *)nvmlDeviceGetMemoryInfo_v2, NULL, 0},
};

static const struct gs_sym *gs_find(const char *name) {
    if (name == NULL || (name[0] != 'c' && name[0] != 'n'))
        return NULL;
    for (size_t i = 0; i < sizeof gs_syms / sizeof *gs_syms; i++)
        if (strcmp(gs_syms[i].name, name) == 0)
            return &gs_syms[i];
    return NULL;
}

/* Replace the real driver's pointer by ours for the names we intercept. */
static void gs_substitute(const char *symbol, void **pfn, cuuint64_t flags, int cudaVersion) {
    const struct gs_sym *s = gs_find(symbol);
    if (s == NULL || pfn == NULL || *pfn == NULL)
        return;
    if (s->v1_name && cudaVersion < 3020)
        return; /* the 32-bit v1 ABI: not ours to replace */
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
        /* the 4-argument form before CUDA 12, the 5-argument one after */
        *pfn = cudaVersion >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
        return;
    }
    *pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && s->fn_ptsz ? s->fn_ptsz
                                                                                  : s->fn;
    gs_log("cuGetProcAddress(%s) -> interposer", symbol);
}

GS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
    REAL_CUDA(CUresult(*)(const char *, void **, int, cuuint64_t,
                          CUdriverProcAddressQueryResult *),
              "cuGetProcAddress_v2");
    CUresult rc = real_fn(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS)
        gs_substitute(symbol, pfn, flags, cudaVersion);
    return rc;
}

GS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags) {
    REAL_CUDA(CUresult(*)(const char *, void **, int, cuuint64_t), "cuGetProcAddress");
    CUresult rc = real_fn(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS)
        gs_substitute(symbol, pfn, flags, cudaVersion);
    return rc;
}

/*
 * RTLD_NEXT asked by another object: glibc would answer relative to the caller of the real dlsym,
 * which is now this library (a preloaded hook after us would get itself back and recurse). Search
 * the objects after the caller's in load order instead.
 */
static void *gs_dlsym_next(const void *caller, const char *name) {
    Dl_info info;
    struct link_map *lm = NULL;
    if (dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) == 0 || lm == NULL)
        return gs_real_dlsym(RTLD_NEXT, name);
    for (struct link_map *l = lm->l_next; l != NULL; l = l->l_next) {
        void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (h == NULL)
            continue;
        void *sym = gs_real_dlsym(h, name);
        dlclose(h);
        if (sym != NULL)
            return sym;
    }
    return NULL;
}

/*
 * dlsym(handle, name) on the driver's own handle bypasses LD_PRELOAD, and that is how the CUDA
 * runtime finds cuGetProcAddress; answer with ours for intercepted names that the handle has.
 */
GS_EXPORT void *dlsym(void *handle, const char *name) {
    void *real = handle == RTLD_NEXT ? gs_dlsym_next(__builtin_return_address(0), name)
                                     : gs_real_dlsym(handle, name);
    if (real == NULL)
        return NULL;
    const struct gs_sym *s = gs_find(name);
    if (s == NULL || s->v1_name || real == s->fn || handle == RTLD_NEXT)
        return real;
    if (strcmp(name, "cuGetProcAddress") == 0)
        return (void *)cuGetProcAddress;
    return s->fn;
}
