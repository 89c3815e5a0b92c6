/*
 * A test double of libcuda.so.1: the same entry points, backed by host memory and counters.
 * Device memory is malloc'ed; "kernels" occupy one fake SM for FAKE_KERNEL_US microseconds each
 * (default 1000), queued back to back like a stream; a launch blocks once two kernels are queued,
 * as a real driver's launch queue does. fakecuda_busy_ns() gives the fake NVML its utilisation.
 * With FAKE_GPU_STATE=<file>, the SM's timeline lives in that shared file, so the processes that
 * name the same file share one fake GPU. Kernels are recorded under the launching process's pid
 * in the host's pid namespace (fakecuda_self_pid), as a real driver knows processes, so a process
 * in a pid namespace of its own (unshare --pid) sees other pids in NVML's samples than getpid().
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <string.h>
#include <time.h>

#include "gpushare_cuda.h"

#define FAKE_TOTAL (16ULL << 30)
#define RING 65536

static __thread int current_dev = -1;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long used_bytes;
struct sm {
    uint64_t last_end;
    uint64_t ring_n;
    uint64_t start[RING];
    uint64_t end[RING];
    int32_t pid[RING];
};
static struct sm *sm;
static int sm_fd = -1;
static pthread_once_t sm_once = PTHREAD_ONCE_INIT;

static void sm_init(void) {
    const char *path = getenv("FAKE_GPU_STATE");
    if (path != NULL && *path != '\0') {
        sm_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (sm_fd >= 0) {
            flock(sm_fd, LOCK_EX);
            if (lseek(sm_fd, 0, SEEK_END) < (off_t)sizeof(struct sm) &&
                ftruncate(sm_fd, sizeof(struct sm)) != 0)
                abort();
            flock(sm_fd, LOCK_UN);
            sm = mmap(NULL, sizeof(struct sm), PROT_READ | PROT_WRITE, MAP_SHARED, sm_fd, 0);
            if (sm == MAP_FAILED)
                abort();
            return;
        }
    }
    sm = calloc(1, sizeof(struct sm));
}

static void sm_lock(void) {
    pthread_once(&sm_once, sm_init);
    pthread_mutex_lock(&lock);
    if (sm_fd >= 0)
        flock(sm_fd, LOCK_EX);
}

static void sm_unlock(void) {
    if (sm_fd >= 0)
        flock(sm_fd, LOCK_UN);
    pthread_mutex_unlock(&lock);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    uint64_t n = now_ns();
    if (t <= n)
        return;
    struct timespec ts = {(time_t)((t - n) / 1000000000ULL), (long)((t - n) % 1000000000ULL)};
    nanosleep(&ts, NULL);
}

/* Busy nanoseconds of the fake SM within [since, until], of one process's kernels (pid > 0) or
 * everyone's (pid 0). */
uint64_t fakecuda_busy_pid_ns(int pid, uint64_t since, uint64_t until) {
    uint64_t busy = 0;
    sm_lock();
    uint64_t n = sm->ring_n < RING ? sm->ring_n : RING;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t j = (sm->ring_n - 1 - i) % RING;
        if (sm->end[j] <= since)
            break;
        if (pid > 0 && sm->pid[j] != pid)
            continue;
        uint64_t s = sm->start[j] > since ? sm->start[j] : since;
        uint64_t e = sm->end[j] < until ? sm->end[j] : until;
        if (e > s)
            busy += e - s;
    }
    sm_unlock();
    return busy;
}

/* The distinct pids whose kernels ran after since (at most max of them); how many. */
int fakecuda_pids(uint64_t since, int *pids, int max) {
    int found = 0;
    sm_lock();
    uint64_t n = sm->ring_n < RING ? sm->ring_n : RING;
    for (uint64_t i = 0; i < n && found < max; i++) {
        uint64_t j = (sm->ring_n - 1 - i) % RING;
        if (sm->end[j] <= since)
            break;
        int k = 0;
        while (k < found && pids[k] != sm->pid[j])
            k++;
        if (k == found)
            pids[found++] = sm->pid[j];
    }
    sm_unlock();
    return found;
}

uint64_t fakecuda_busy_ns(uint64_t since, uint64_t until) {
    return fakecuda_busy_pid_ns(0, since, until);
}

uint64_t fakecuda_now_ns(void) { return now_ns(); }

/* This process's pid as /proc names it (NSpid's first field: the pid namespace that mounted
 * /proc, the host's in the tests), or getpid() where /proc cannot tell. */
int fakecuda_self_pid(void) {
    static int pid, of;
    if (pid != 0 && of == getpid())
        return pid;
    of = getpid();
    pid = of;
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pid;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return pid;
    buf[n] = '\0';
    char *line = strstr(buf, "\nNSpid:");
    if (line != NULL)
        pid = (int)strtol(line + 7, NULL, 10);
    return pid > 0 ? pid : (pid = of);
}

static CUresult launch(void) {
    static uint64_t kernel_ns;
    if (kernel_ns == 0) {
        const char *v = getenv("FAKE_KERNEL_US");
        kernel_ns = (v ? strtoull(v, NULL, 10) : 1000ULL) * 1000ULL;
    }
    sm_lock();
    uint64_t n = now_ns();
    uint64_t start = sm->last_end > n ? sm->last_end : n;
    uint64_t end = start + kernel_ns;
    sm->start[sm->ring_n % RING] = start;
    sm->end[sm->ring_n % RING] = end;
    sm->pid[sm->ring_n % RING] = (int32_t)fakecuda_self_pid();
    sm->ring_n++;
    sm->last_end = end;
    sm_unlock();
    if (end > n + 2 * kernel_ns)
        sleep_until(end - 2 * kernel_ns);
    return CUDA_SUCCESS;
}

/*
 * The GPUs. FAKE_GPU_UUIDS names the physical GPUs in PCI order, comma-separated, in NVML's form
 * (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx); without it there are two, GPU-fa4e0000-0000-4000-
 * 8000-00000000000<index>. What a process sees follows the CUDA documentation, not more:
 * - CUDA_VISIBLE_DEVICES (CUDA C++ Programming Guide, "CUDA Environment Variables"): a
 *   comma-separated list of GPU indices or UUIDs as nvidia-smi prints them ("GPU-..."), a UUID
 *   perhaps cut to the part that tells it from the others. Only the listed GPUs are visible, and
 *   CUDA numbers them in the order listed; an entry that names no GPU hides itself and every
 *   entry after it. Unset: every GPU.
 *   An entry naming a GPU already listed is taken as invalid here (the guide does not say).
 * - CUDA_DEVICE_ORDER (same page): FASTEST_FIRST (the default) or PCI_BUS_ID orders the indices;
 *   the fake GPUs are identical, so both give PCI order.
 * - cuDeviceGetUuid / cuDeviceGetUuid_v2 (driver API reference, "Device Management"): the 16
 *   bytes of the device's UUID, which belongs to the physical GPU, whatever its ordinal is.
 * One memory counter serves every GPU (FAKE_TOTAL in all).
 */
#define FAKE_MAX_GPUS 16
static char gpu_uuid[FAKE_MAX_GPUS][48];
static int gpu_count;
static int visible[FAKE_MAX_GPUS]; /* the physical GPU of each CUDA ordinal */
static int visible_count;
static pthread_once_t gpus_once = PTHREAD_ONCE_INIT;

static void gpus_init(void) {
    const char *names = getenv("FAKE_GPU_UUIDS");
    if (names != NULL && *names != '\0') {
        for (const char *p = names; *p != '\0' && gpu_count < FAKE_MAX_GPUS;) {
            size_t n = strcspn(p, ",");
            snprintf(gpu_uuid[gpu_count++], sizeof gpu_uuid[0], "%.*s", (int)n, p);
            p += n + (p[n] == ',');
        }
    } else {
        for (gpu_count = 0; gpu_count < 2; gpu_count++)
            snprintf(gpu_uuid[gpu_count], sizeof gpu_uuid[0],
                     "GPU-fa4e0000-0000-4000-8000-%012d", gpu_count);
    }
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    if (list == NULL) {
        for (int i = 0; i < gpu_count; i++)
            visible[visible_count++] = i;
        return;
    }
    for (const char *p = list; *p != '\0' && visible_count < FAKE_MAX_GPUS;) {
        size_t n = strcspn(p, ",");
        char entry[48];
        snprintf(entry, sizeof entry, "%.*s", (int)n, p);
        p += n + (p[n] == ',');
        int found = -1;
        if (entry[0] != '\0' && strspn(entry, "0123456789") == strlen(entry)) {
            int index = atoi(entry);
            found = index < gpu_count ? index : -1;
        } else if (strncmp(entry, "GPU-", 4) == 0 && entry[4] != '\0') {
            for (int i = 0; i < gpu_count; i++) {
                if (strncasecmp(gpu_uuid[i], entry, strlen(entry)) != 0)
                    continue;
                found = found < 0 ? i : -2; /* -2: more than one GPU begins so */
            }
        }
        for (int k = 0; k < visible_count && found >= 0; k++)
            if (visible[k] == found)
                found = -1;
        if (found < 0)
            return;
        visible[visible_count++] = found;
    }
}

/* The fake NVML's view: physical GPUs, which CUDA_VISIBLE_DEVICES does not change. */
int fakecuda_gpu_count(void) {
    pthread_once(&gpus_once, gpus_init);
    return gpu_count;
}

const char *fakecuda_gpu_uuid(int physical) {
    pthread_once(&gpus_once, gpus_init);
    return physical >= 0 && physical < gpu_count ? gpu_uuid[physical] : NULL;
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int *count) {
    pthread_once(&gpus_once, gpus_init);
    *count = visible_count;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    pthread_once(&gpus_once, gpus_init);
    if (ordinal < 0 || ordinal >= visible_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    pthread_once(&gpus_once, gpus_init);
    if (dev < 0 || dev >= visible_count)
        return CUDA_ERROR_INVALID_DEVICE;
    const char *hex = gpu_uuid[visible[dev]] + 4;
    memset(uuid->bytes, 0, sizeof uuid->bytes);
    for (int i = 0; i < 16 && *hex != '\0';) {
        unsigned int byte;
        if (*hex == '-' || sscanf(hex, "%2x", &byte) != 1) {
            hex++;
            continue;
        }
        uuid->bytes[i++] = (char)byte;
        hex += 2;
    }
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    current_dev = dev;
    *pctx = (CUcontext)(intptr_t)(dev + 1);
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    *pctx = (CUcontext)(intptr_t)(dev + 1);
    return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext ctx) {
    current_dev = (int)(intptr_t)ctx - 1;
    return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice *device) {
    if (current_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = current_dev;
    return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize(void) {
    sm_lock();
    uint64_t end = sm->last_end;
    sm_unlock();
    sleep_until(end);
    return CUDA_SUCCESS;
}

static CUresult host_alloc(CUdeviceptr *dptr, size_t size) {
    pthread_mutex_lock(&lock);
    int full = used_bytes + size > FAKE_TOTAL;
    if (!full)
        used_bytes += size;
    pthread_mutex_unlock(&lock);
    if (full)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* room in front of the block for its size */
    size_t *p = malloc(size + 16);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p[0] = size;
    *dptr = (CUdeviceptr)(uintptr_t)(p + 2);
    return CUDA_SUCCESS;
}

static CUresult host_free(CUdeviceptr dptr) {
    if (dptr == 0)
        return CUDA_SUCCESS;
    size_t *p = (size_t *)(uintptr_t)dptr - 2;
    pthread_mutex_lock(&lock);
    used_bytes -= p[0];
    pthread_mutex_unlock(&lock);
    free(p);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { return host_alloc(dptr, bytesize); }
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int elementSizeBytes) {
    (void)elementSizeBytes;
    *pitch = (width + 511) / 512 * 512;
    return host_alloc(dptr, *pitch * height);
}
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    (void)flags;
    return host_alloc(dptr, bytesize);
}
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    (void)stream;
    return host_alloc(dptr, bytesize);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream) {
    (void)pool;
    (void)stream;
    return host_alloc(dptr, bytesize);
}
CUresult cuMemFree_v2(CUdeviceptr dptr) { return host_free(dptr); }
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    (void)stream;
    return host_free(dptr);
}
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    (void)prop;
    (void)flags;
    CUdeviceptr p;
    CUresult rc = host_alloc(&p, size);
    if (rc == CUDA_SUCCESS)
        *handle = p;
    return rc;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return host_free(handle); }
/* VMM address space: reserving and mapping cost nothing here; the handle holds the memory. */
CUresult cuMemGetAllocationGranularity(size_t *granularity, const void *prop, int option) {
    (void)prop;
    (void)option;
    *granularity = 2u << 20;
    return CUDA_SUCCESS;
}
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)alignment;
    (void)addr;
    (void)flags;
    static CUdeviceptr next = (CUdeviceptr)1 << 40;
    pthread_mutex_lock(&lock);
    *ptr = next;
    next += (size + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    (void)ptr;
    (void)size;
    return CUDA_SUCCESS;
}
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    (void)ptr;
    (void)size;
    (void)offset;
    (void)flags;
    return handle ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    (void)ptr;
    (void)size;
    return CUDA_SUCCESS;
}
CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc) {
    CUdeviceptr p;
    CUresult rc = host_alloc(&p, desc->Width * desc->Height * desc->NumChannels * 4);
    if (rc == CUDA_SUCCESS)
        *array = (CUarray)(uintptr_t)p;
    return rc;
}
CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    CUdeviceptr p;
    CUresult rc =
        host_alloc(&p, desc->Width * desc->Height * desc->Depth * desc->NumChannels * 4);
    if (rc == CUDA_SUCCESS)
        *array = (CUarray)(uintptr_t)p;
    return rc;
}
CUresult cuArrayDestroy(CUarray array) { return host_free((CUdeviceptr)(uintptr_t)array); }
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    pthread_mutex_lock(&lock);
    *free_bytes = FAKE_TOTAL - used_bytes;
    pthread_mutex_unlock(&lock);
    *total_bytes = FAKE_TOTAL;
    return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    (void)dev;
    *bytes = FAKE_TOTAL;
    return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                        CUstream stream, void **params, void **extra) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem;
    (void)stream, (void)params, (void)extra;
    return launch();
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                          void **extra) {
    (void)config, (void)f, (void)params, (void)extra;
    return launch();
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                   unsigned int gz, unsigned int bx, unsigned int by,
                                   unsigned int bz, unsigned int shmem, CUstream stream,
                                   void **params) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem;
    (void)stream, (void)params;
    return launch();
}

CUresult cuGraphLaunch(CUgraphExec graph, CUstream stream) {
    (void)graph, (void)stream;
    return launch();
}

/* The driver answers with its own functions, as the real one does. */
static const struct {
    const char *name;
    void *fn;
} table[] = {
    {"cuInit", (void *)cuInit},
    {"cuMemAlloc", (void *)cuMemAlloc_v2},
    {"cuMemAllocPitch", (void *)cuMemAllocPitch_v2},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync},
    {"cuMemFree", (void *)cuMemFree_v2},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync},
    {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemRelease", (void *)cuMemRelease},
    {"cuMemGetInfo", (void *)cuMemGetInfo_v2},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem_v2},
    {"cuLaunchKernel", (void *)cuLaunchKernel},
    {"cuLaunchKernelEx", (void *)cuLaunchKernelEx},
    {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel},
    {"cuGraphLaunch", (void *)cuGraphLaunch},
    {"cuCtxGetDevice", (void *)cuCtxGetDevice},
    {"cuDeviceGetUuid", (void *)cuDeviceGetUuid_v2},
    {"cuGetProcAddress", (void *)cuGetProcAddress_v2},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    (void)cudaVersion, (void)flags;
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        if (strcmp(table[i].name, symbol) == 0) {
            *pfn = table[i].fn;
            if (symbolStatus)
                *symbolStatus = 0;
            return CUDA_SUCCESS;
        }
    }
    *pfn = NULL;
    if (symbolStatus)
        *symbolStatus = 1;
    return CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
