/*
 * Runs driver API memory operations given as arguments and prints one line per operation:
 *   alloc:MiB  pitch:WIDTH:HEIGHT  async:MiB  pool:MiB  vmm:MiB  managed:MiB  free  release
 *   array:MiB (a 2D float4 array)  array3d:MiB (a 3D 8-bit array)  destroy
 *   procaddr:MiB (cuMemAlloc through cuGetProcAddress on a dlopen'ed driver handle)
 *   info (cuMemGetInfo, cuDeviceTotalMem)  nvml (nvmlDeviceGetMemoryInfo, _v2)  init  hold
 *   objects (the path of every loaded object, as the loader names it)  sleep:MS
 * Lines read "<op> rc=<CUresult> ...". Linked against the fake driver and NVML.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpushare_cuda.h"

#define MIB (1ULL << 20)

static int print_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    if (info->dlpi_name[0] != '\0')
        printf("object=%s ", info->dlpi_name);
    return 0;
}

int main(int argc, char **argv) {
    CUdeviceptr ptrs[256];
    CUmemGenericAllocationHandle handles[256];
    CUarray arrays[256];
    int np = 0, nh = 0, na = 0;
    CUcontext ctx;
    cuInit(0);
    const char *dev_env = getenv("MEMOPS_DEVICE");
    cuCtxCreate_v2(&ctx, 0, dev_env ? atoi(dev_env) : 0);
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        char *op = argv[i];
        unsigned long long mib = 0;
        char *colon = strchr(op, ':');
        if (colon)
            mib = strtoull(colon + 1, NULL, 10);
        CUresult rc = 0;
        if (strncmp(op, "alloc:", 6) == 0) {
            rc = cuMemAlloc_v2(&ptrs[np], mib * MIB);
            np += rc == 0;
        } else if (strncmp(op, "pitch:", 6) == 0) {
            size_t pitch = 0, h = strtoull(strchr(colon + 1, ':') + 1, NULL, 10);
            rc = cuMemAllocPitch_v2(&ptrs[np], &pitch, mib, h, 4);
            np += rc == 0;
            printf("pitch=%zu ", pitch);
        } else if (strncmp(op, "async:", 6) == 0) {
            rc = cuMemAllocAsync(&ptrs[np], mib * MIB, NULL);
            np += rc == 0;
        } else if (strncmp(op, "pool:", 5) == 0) {
            rc = cuMemAllocFromPoolAsync(&ptrs[np], mib * MIB, NULL, NULL);
            np += rc == 0;
        } else if (strncmp(op, "vmm:", 4) == 0) {
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = 1;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = 0;
            rc = cuMemCreate(&handles[nh], mib * MIB, &prop, 0);
            nh += rc == 0;
        } else if (strncmp(op, "array:", 6) == 0) {
            CUDA_ARRAY_DESCRIPTOR d = {1024, mib * 64, 0x20, 4}; /* 1024 x 64m float4 = m MiB */
            rc = cuArrayCreate_v2(&arrays[na], &d);
            na += rc == 0;
        } else if (strncmp(op, "array3d:", 8) == 0) {
            CUDA_ARRAY3D_DESCRIPTOR d = {1024, 1024, mib, 0x01, 1, 0}; /* 1 MiB per slice */
            rc = cuArray3DCreate_v2(&arrays[na], &d);
            na += rc == 0;
        } else if (strcmp(op, "destroy") == 0) {
            rc = na > 0 ? cuArrayDestroy(arrays[--na]) : CUDA_ERROR_INVALID_VALUE;
        } else if (strncmp(op, "managed:", 8) == 0) {
            CUdeviceptr p;
            rc = cuMemAllocManaged(&p, mib * MIB, 1);
        } else if (strcmp(op, "free") == 0) {
            rc = np > 0 ? cuMemFree_v2(ptrs[--np]) : CUDA_ERROR_INVALID_VALUE;
        } else if (strcmp(op, "freeasync") == 0) {
            rc = np > 0 ? cuMemFreeAsync(ptrs[--np], NULL) : CUDA_ERROR_INVALID_VALUE;
        } else if (strcmp(op, "release") == 0) {
            rc = nh > 0 ? cuMemRelease(handles[--nh]) : CUDA_ERROR_INVALID_VALUE;
        } else if (strncmp(op, "procaddr:", 9) == 0) {
            /* what a CUDA 11.3+ runtime does: dlopen the driver, dlsym cuGetProcAddress */
            void *h = dlopen(getenv("MEMOPS_DRIVER"), RTLD_NOW);
            typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult *);
            gpa_t gpa = h ? (gpa_t)dlsym(h, "cuGetProcAddress_v2") : NULL;
            void *fn = NULL;
            rc = gpa ? gpa("cuMemAlloc", &fn, 12000, 0, NULL) : CUDA_ERROR_NOT_FOUND;
            if (rc == 0) {
                rc = ((CUresult(*)(CUdeviceptr *, size_t))fn)(&ptrs[np], mib * MIB);
                np += rc == 0;
            }
        } else if (strcmp(op, "info") == 0) {
            size_t fr = 0, tot = 0, dt = 0;
            rc = cuMemGetInfo_v2(&fr, &tot);
            cuDeviceTotalMem_v2(&dt, 0);
            printf("free=%zu total=%zu device_total=%zu ", fr, tot, dt);
        } else if (strcmp(op, "nvml") == 0) {
            nvmlDevice_t d;
            nvmlMemory_t m;
            nvmlMemory_v2_t m2;
            nvmlInit_v2();
            nvmlDeviceGetHandleByIndex_v2(0, &d);
            rc = nvmlDeviceGetMemoryInfo(d, &m);
            m2.version = 2;
            nvmlDeviceGetMemoryInfo_v2(d, &m2);
            printf("total=%llu used=%llu free=%llu v2_total=%llu v2_used=%llu ", m.total, m.used,
                   m.free, m2.total, m2.used);
        } else if (strcmp(op, "objects") == 0) {
            dl_iterate_phdr(print_object, NULL);
        } else if (strncmp(op, "sleep:", 6) == 0) {
            usleep((useconds_t)(mib * 1000)); /* milliseconds, in the number's place */
        } else if (strcmp(op, "init") == 0) {
            rc = cuInit(0);
        } else if (strcmp(op, "hold") == 0) {
            printf("hold rc=0\n");
            pause();
        } else {
            fprintf(stderr, "unknown op %s\n", op);
            return 2;
        }
        printf("%s rc=%d\n", op, rc);
    }
    return 0;
}
