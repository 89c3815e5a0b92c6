/*
 * Launches fake kernels flat out (cuLaunchKernel; one in four each through cuLaunchKernelEx,
 * cuLaunchCooperativeKernel and cuGraphLaunch) for SECONDS and prints the fake SM's utilisation over the second
 * half of the run: "util=<percent> launches=<n> own=<percent>", own being this process's kernels
 * alone (on a fake GPU shared through FAKE_GPU_STATE; by the pid the fake driver records). An optional second argument is the device
 * ordinal to launch on (default 0). With LAUNCHES_AT_NS=<CLOCK_MONOTONIC ns> it starts launching
 * then, so that processes started side by side measure the same stretch of time.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gpushare_cuda.h"

uint64_t fakecuda_busy_ns(uint64_t since, uint64_t until);
uint64_t fakecuda_busy_pid_ns(int pid, uint64_t since, uint64_t until);
uint64_t fakecuda_now_ns(void);
int fakecuda_self_pid(void);

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    int dev = argc > 2 ? atoi(argv[2]) : 0;
    CUcontext ctx;
    cuInit(0);
    cuCtxCreate_v2(&ctx, 0, dev);
    const char *at = getenv("LAUNCHES_AT_NS"); /* start then (CLOCK_MONOTONIC): runs side by side
                                                  measure the same stretch of time */
    while (at != NULL && fakecuda_now_ns() < strtoull(at, NULL, 10))
        usleep(1000);
    uint64_t start = fakecuda_now_ns();
    uint64_t end = start + (uint64_t)(seconds * 1e9);
    uint64_t half = start + (uint64_t)(seconds * 0.5e9);
    unsigned long n = 0;
    while (fakecuda_now_ns() < end) {
        if (n % 4 == 1)
            cuLaunchKernelEx(NULL, (CUfunction)1, NULL, NULL);
        else if (n % 4 == 2)
            cuLaunchCooperativeKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
        else if (n % 4 == 3)
            cuGraphLaunch(NULL, NULL);
        else
            cuLaunchKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        n++;
    }
    cuCtxSynchronize();
    uint64_t stop = fakecuda_now_ns();
    double util = 100.0 * (double)fakecuda_busy_ns(half, stop) / (double)(stop - half);
    double own = 100.0 * (double)fakecuda_busy_pid_ns(fakecuda_self_pid(), half, stop) / (double)(stop - half);
    printf("util=%.1f launches=%lu own=%.1f\n", util, n, own);
    return 0;
}
