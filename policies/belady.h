/* The lower bound on expert loads that every single-precision, whole-expert cache policy obeys:
 * Belady's minimum number of loads for one cache of `capacity` items fed an access sequence one
 * access at a time (Belady 1966, "A study of replacement algorithms for a virtual-storage
 * computer", IBM Systems Journal 5(2); optimal among all replacement schedules, prefetching ones
 * included, since any schedule can be made a demand schedule with no more loads: Mattson,
 * Gecsei, Slutz & Traiger 1970, "Evaluation techniques for storage hierarchies", IBM Systems
 * Journal 9(2)).
 *
 * Why it bounds the simulator's policies (policies/README.md, "oracle"): a policy that holds at
 * most `capacity` experts at one precision and runs every access resident serves the access
 * sequence in execution order (routes in the order the host runs them, a route's accesses in any
 * order) with a cache of that size, so it loads at least this many experts, warm-up placement
 * included. The simulator's pinned-route rule only adds constraints. It bounds loads and bytes
 * moved, not the hit rate (a hit counts activations) nor the makespan. Pure: no I/O. */
#ifndef MOESIM_POLICIES_BELADY_H
#define MOESIM_POLICIES_BELADY_H

#include <stddef.h>
#include <stdint.h>

/* Loads (misses from a cold cache) of Belady's rule on `seq` (ids < n_ids) with room for
 * `capacity` >= 1 items: evict the item whose next use lies furthest ahead. */
uint64_t belady_min_loads(const uint32_t *seq, size_t n, uint32_t n_ids, uint32_t capacity);

#endif
