/* Aborting allocators; see alloc.h. */
#include "common/alloc.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Noreturn void out_of_memory(size_t size) {
    fprintf(stderr, "moesim: out of memory allocating %zu bytes\n", size);
    abort();
}

void *moesim_xmalloc(size_t size) {
    void *p = malloc(size ? size : 1);
    if (!p) out_of_memory(size);
    return p;
}

void *moesim_xaligned(size_t align, size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, align, size ? size : 1)) out_of_memory(size);
    return p;
}

void *moesim_xcalloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) out_of_memory(SIZE_MAX);
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) out_of_memory(count * size);
    return p;
}

void *moesim_xrealloc(void *ptr, size_t size) {
    void *p = realloc(ptr, size ? size : 1);
    if (!p) out_of_memory(size);
    return p;
}

char *moesim_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = moesim_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

double moesim_physical_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (double)pages * (double)page : 0;
}
