/*
 * What fake_nvml.c needs to stand alone as a driver root's libnvidia-ml.so.1 (harness/platforms.py):
 * compiled together with it, with this file force-included first (-include).
 *
 * fake_nvml.c finds its GPUs through dlsym(RTLD_DEFAULT, "fakecuda_*"), which sees only libraries
 * loaded into the global scope. A device plugin loads NVML alone (nvidia-ml-py opens it with
 * ctypes, RTLD_LOCAL) and never the fake driver, so those lookups are sent here instead: a fixed
 * number of GPUs (FAKE_GPU_COUNT, default 2) with fixed UUIDs. nvidia-ml-py also calls three
 * functions fake_nvml.c does not define; they are weak, so a fake_nvml.c that gains them wins.
 */
#ifndef DRIVER_ROOT_NVML_HEADER
#define DRIVER_ROOT_NVML_HEADER
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int driver_root_gpu_count(void) {
    const char *n = getenv("FAKE_GPU_COUNT");
    return n ? atoi(n) : 2;
}

static const char *driver_root_gpu_uuid(int index) {
    static char uuids[16][48];
    if (index < 0 || index >= 16 || index >= driver_root_gpu_count())
        return NULL;
    snprintf(uuids[index], sizeof uuids[index], "GPU-d71e0000-0000-4000-8000-%012d", index);
    return uuids[index];
}

static void *driver_root_symbol(const char *name) {
    if (strcmp(name, "fakecuda_gpu_count") == 0)
        return (void *)driver_root_gpu_count;
    if (strcmp(name, "fakecuda_gpu_uuid") == 0)
        return (void *)driver_root_gpu_uuid;
    return NULL; /* utilisation: no fake SM here, so NVML reports none */
}

#define dlsym(handle, name) ((void)(handle), driver_root_symbol(name))

int nvmlInitWithFlags(unsigned int flags) __attribute__((weak));
int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return 0;
}

int nvmlDeviceGetName(void *device, char *name, unsigned int length) __attribute__((weak));
int nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    (void)device;
    snprintf(name, length, "Fake Driver-Root GPU");
    return 0;
}

const char *nvmlErrorString(int result) __attribute__((weak));
const char *nvmlErrorString(int result) {
    return result == 0 ? "Success" : "Fake NVML error";
}
#endif
