/*
 * A test double of libcuda.so.1: the same entry points, backed by host memory and counters.
 * Device memory is malloc'ed; "kernels" occupy one fake SM for FAKE_KERNEL_US microseconds each
 * (default 1000), queued back to back like a stream; a launch blocks once two kernels are queued,
 * as a real driver's launch queue does. fakecuda_busy_ns() gives the fake NVML its utilisation.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpushare_cuda.h"

#define FAKE_TOTAL (16ULL << 30)
#define RING 65536

static __thread int current_dev = -1;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long used_bytes;
static uint64_t ring_start[RING], ring_end[RING];
static unsigned long ring_n;
static uint64_t last_end;

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

/* Busy nanoseconds of the fake SM within [since, until]. */
uint64_t fakecuda_busy_ns(uint64_t since, uint64_t until) {
    uint64_t busy = 0;
    pthread_mutex_lock(&lock);
    unsigned long n = ring_n < RING ? ring_n : RING;
    for (unsigned long i = 0; i < n; i++) {
        unsigned long j = (ring_n - 1 - i) % RING;
        if (ring_end[j] <= since)
            break;
        uint64_t s = ring_start[j] > since ? ring_start[j] : since;
        uint64_t e = ring_end[j] < until ? ring_end[j] : until;
        if (e > s)
            busy += e - s;
    }
    pthread_mutex_unlock(&lock);
    return busy;
}

uint64_t fakecuda_now_ns(void) { return now_ns(); }

static CUresult launch(void) {
    static uint64_t kernel_ns;
    if (kernel_ns == 0) {
        const char *v = getenv("FAKE_KERNEL_US");
        kernel_ns = (v ? strtoull(v, NULL, 10) : 1000ULL) * 1000ULL;
    }
    pthread_mutex_lock(&lock);
    uint64_t n = now_ns();
    uint64_t start = last_end > n ? last_end : n;
    uint64_t end = start + kernel_ns;
    ring_start[ring_n % RING] = start;
    ring_end[ring_n % RING] = end;
    ring_n++;
    last_end = end;
    pthread_mutex_unlock(&lock);
    if (end > n + 2 * kernel_ns)
        sleep_until(end - 2 * kernel_ns);
    return CUDA_SUCCESS;
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int *count) {
    *count = 2;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (ordinal < 0 || ordinal >= 2)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
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
    sleep_until(last_end);
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
