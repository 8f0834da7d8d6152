/* The fused kernels' threads: a pool of their own, so that a kernel called from any thread splits its work at once.
 *
 * libgomp (torch's OpenMP) lets its idle workers spin only while it manages no more threads than there are CPUs; once
 * a second thread has run a parallel region (the batcher's thread beside the main one) every worker sleeps between
 * regions, and each region then waits for a futex wake-up: ~150 us on the project's 2-core VMs, several times a small
 * kernel's own work, ~240 times a decoding step (docs/design/attention.md, "Threads"). These workers spin for
 * SPIN_NS after each job, then sleep on a condition variable; a kernel's call wakes them only when they sleep.
 *
 * run_parts(fn, ctx, parts) calls fn(ctx, p) for every p in [0, parts), part 0 in the caller, the others in workers
 * (started on first use, up to POOL_MAX); it returns when every part is done. One job at a time: a caller that finds
 * the pool busy runs its parts itself, one after the other. Which thread runs a part never changes its result. A
 * forked child starts with no workers (pthread_atfork).
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define POOL_MAX 63
#define SPIN_NS 500000  /* a worker's spin after a job before it sleeps: longer than the gaps inside a decoding step */

typedef void (*part_fn)(void *ctx, int part);

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;  /* held by the caller of the job in flight */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int started;  /* workers running (under pool_lock) */
static atomic_ulong generation;  /* bumped once per job, under pool_lock */
static atomic_int sleepers, remaining;  /* workers asleep; workers not done with the job in flight */
static part_fn job_fn;
static void *job_ctx;
static int job_parts;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

struct worker_start { int id; unsigned long seen; };

static void *worker(void *arg) {
    struct worker_start start = *(struct worker_start *)arg;
    free(arg);
    unsigned long seen = start.seen, g;
    for (;;) {
        int64_t deadline = now_ns() + SPIN_NS;
        for (int spins = 0; (g = atomic_load(&generation)) == seen; spins++) {
            _mm_pause();
            if ((spins & 255) == 255 && now_ns() > deadline) {
                pthread_mutex_lock(&sleep_lock);
                atomic_fetch_add(&sleepers, 1);  /* before the check below: run_parts reads it after its bump */
                while ((g = atomic_load(&generation)) == seen) pthread_cond_wait(&wake, &sleep_lock);
                atomic_fetch_sub(&sleepers, 1);
                pthread_mutex_unlock(&sleep_lock);
                break;
            }
        }
        seen = g;
        if (start.id < job_parts) job_fn(job_ctx, start.id);
        atomic_fetch_sub(&remaining, 1);
    }
    return NULL;
}

static void pool_forked(void) {  /* the child of a fork has none of the parent's workers */
    pthread_mutex_init(&pool_lock, NULL);
    pthread_mutex_init(&sleep_lock, NULL);
    pthread_cond_init(&wake, NULL);
    started = 0;
    atomic_store(&sleepers, 0);
    atomic_store(&remaining, 0);
}

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static void pool_init(void) { pthread_atfork(NULL, NULL, pool_forked); }

static void run_parts(part_fn fn, void *ctx, int parts) {
    if (parts > 1) pthread_once(&pool_once, pool_init);
    if (parts <= 1 || pthread_mutex_trylock(&pool_lock) != 0) {
        for (int p = 0; p < parts; p++) fn(ctx, p);
        return;
    }
    while (started < parts - 1 && started < POOL_MAX) {
        struct worker_start *arg = malloc(sizeof *arg);
        pthread_t thread;
        if (!arg) break;
        arg->id = started + 1;
        arg->seen = atomic_load(&generation);
        if (pthread_create(&thread, NULL, worker, arg) != 0) {
            free(arg);
            break;
        }
        pthread_detach(thread);
        started++;
    }
    job_fn = fn;
    job_ctx = ctx;
    job_parts = parts;
    atomic_store(&remaining, started);
    atomic_fetch_add(&generation, 1);
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&sleep_lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&sleep_lock);
    }
    fn(ctx, 0);
    for (int p = started + 1; p < parts; p++) fn(ctx, p);  /* parts no worker took (too few could start) */
    while (atomic_load(&remaining) > 0) _mm_pause();
    pthread_mutex_unlock(&pool_lock);
}
