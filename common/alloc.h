/* Allocation for sizes moesim itself decided. Out of memory here is fatal (a message and abort):
 * sizes that come from input files must be checked against the file before they reach these
 * functions, so that a corrupt header gives a moesim_error instead. */
#ifndef MOESIM_COMMON_ALLOC_H
#define MOESIM_COMMON_ALLOC_H

#include <stddef.h>

void *moesim_xmalloc(size_t size);
void *moesim_xcalloc(size_t count, size_t size); /* checks count * size for overflow */
void *moesim_xrealloc(void *ptr, size_t size);
char *moesim_xstrdup(const char *s);
/* `size` bytes aligned to `align` (a power of two, a multiple of sizeof(void *)); free() it. */
void *moesim_xaligned(size_t align, size_t size);
/* The machine's physical memory in bytes (0 when unknown): a size an input asks for (a budget,
 * a request count) is checked against it before it reaches the functions above. */
double moesim_physical_memory_bytes(void);

#endif
