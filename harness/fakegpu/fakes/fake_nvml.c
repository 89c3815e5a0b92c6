/*
 * A test double of libnvidia-ml.so.1. Utilisation follows the fake driver's model: the busy time
 * of its fake SM over the last FAKE_NVML_WINDOW_MS milliseconds (default 200), as a percentage;
 * the per-process samples give each process whose kernels ran in that window its own busy time,
 * as NVML's do on a shared GPU. Memory: 16 GiB, nothing used.
 *
 * Loaded without the fake driver (a device plugin reading the GPUs from a driver root), it names
 * the GPUs itself, from FAKE_GPU_UUIDS as the fake driver reads it, else the same two. The minor
 * number of a GPU is its index, as on a node whose driver numbers /dev/nvidia<N> in PCI order.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpushare_cuda.h"

typedef uint64_t (*busy_t)(uint64_t, uint64_t);
typedef uint64_t (*now_t)(void);

static double util_pct(void) {
    static busy_t busy;
    static now_t now;
    if (busy == NULL) {
        busy = (busy_t)dlsym(RTLD_DEFAULT, "fakecuda_busy_ns");
        now = (now_t)dlsym(RTLD_DEFAULT, "fakecuda_now_ns");
    }
    if (busy == NULL || now == NULL)
        return 0;
    const char *w = getenv("FAKE_NVML_WINDOW_MS");
    uint64_t window = (w ? strtoull(w, NULL, 10) : 200ULL) * 1000000ULL;
    uint64_t t = now();
    return 100.0 * (double)busy(t - window, t) / (double)window;
}

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
/* The fake driver's physical GPUs (FAKE_GPU_UUIDS, else two), in PCI order: NVML does not read
 * CUDA_VISIBLE_DEVICES, so its indexes and UUIDs are the GPUs', whatever CUDA's ordinals are. */
typedef int (*count_t)(void);
typedef const char *(*uuid_of_t)(int);

#define OWN_MAX_GPUS 16
static char own_uuid[OWN_MAX_GPUS][96];
static int own_count = -1;

/* The GPUs as FAKE_GPU_UUIDS names them (else two), for a process without the fake driver. */
static void own_gpus(void) {
    if (own_count >= 0)
        return;
    own_count = 0;
    const char *names = getenv("FAKE_GPU_UUIDS");
    if (names != NULL && *names != '\0') {
        for (const char *p = names; *p != '\0' && own_count < OWN_MAX_GPUS;) {
            size_t n = strcspn(p, ",");
            snprintf(own_uuid[own_count++], sizeof own_uuid[0], "%.*s", (int)n, p);
            p += n + (p[n] == ',');
        }
        return;
    }
    for (; own_count < 2; own_count++)
        snprintf(own_uuid[own_count], sizeof own_uuid[0], "GPU-fa4e0000-0000-4000-8000-%012d",
                 own_count);
}

static int gpu_count(void) {
    static count_t count;
    if (count == NULL)
        count = (count_t)dlsym(RTLD_DEFAULT, "fakecuda_gpu_count");
    if (count != NULL)
        return count();
    own_gpus();
    return own_count;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    *count = (unsigned int)gpu_count();
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= (unsigned int)gpu_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(uintptr_t)(index + 1);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    *index = (unsigned int)(uintptr_t)device - 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    static uuid_of_t of;
    if (of == NULL)
        of = (uuid_of_t)dlsym(RTLD_DEFAULT, "fakecuda_gpu_uuid");
    int index = (int)(uintptr_t)device - 1;
    const char *found = NULL;
    if (of != NULL) {
        found = of(index);
    } else {
        own_gpus();
        found = index >= 0 && index < own_count ? own_uuid[index] : NULL;
    }
    if (found == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(found) >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(uuid, found);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    *minor = (unsigned int)(uintptr_t)device - 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    (void)device;
    if (length < sizeof "Fake GPU")
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(name, "Fake GPU");
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    (void)device;
    memory->total = 16ULL << 30;
    memory->used = 0;
    memory->free = memory->total;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    (void)device;
    memory->total = 16ULL << 30;
    memory->reserved = 0;
    memory->used = 0;
    memory->free = memory->total;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    (void)device;
    u->gpu = (unsigned int)(util_pct() + 0.5);
    u->memory = 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count, unsigned long long since) {
    (void)device, (void)since;
    typedef int (*pids_t)(uint64_t, int *, int);
    typedef uint64_t (*busy_pid_t)(int, uint64_t, uint64_t);
    static pids_t pids_of;
    static busy_pid_t busy_of;
    static now_t now;
    if (pids_of == NULL) {
        pids_of = (pids_t)dlsym(RTLD_DEFAULT, "fakecuda_pids");
        busy_of = (busy_pid_t)dlsym(RTLD_DEFAULT, "fakecuda_busy_pid_ns");
        now = (now_t)dlsym(RTLD_DEFAULT, "fakecuda_now_ns");
    }
    if (pids_of == NULL || busy_of == NULL || now == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    const char *w = getenv("FAKE_NVML_WINDOW_MS");
    uint64_t window = (w ? strtoull(w, NULL, 10) : 200ULL) * 1000000ULL;
    uint64_t t = now();
    int pids[64];
    int n = pids_of(t - window, pids, 64);
    if (samples == NULL || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        samples[i].pid = (unsigned int)pids[i];
        samples[i].timeStamp = 0;
        samples[i].smUtil = (unsigned int)(100.0 * (double)busy_of(pids[i], t - window, t) /
                                               (double)window +
                                           0.5);
        samples[i].memUtil = samples[i].encUtil = samples[i].decUtil = 0;
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}
