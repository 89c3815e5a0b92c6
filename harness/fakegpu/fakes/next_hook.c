/*
 * A second preloaded hook, loaded after the interposer, that wraps cuInit and finds the real one
 * with dlsym(RTLD_NEXT): it must get the driver's, not itself (which would recurse). Returns 999
 * if it got itself.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "gpushare_cuda.h"

CUresult cuInit(unsigned int flags) {
    CUresult (*next)(unsigned int) = (CUresult(*)(unsigned int))dlsym(RTLD_NEXT, "cuInit");
    if (next == NULL)
        return 998;
    if (next == cuInit)
        return 999;
    return next(flags);
}
