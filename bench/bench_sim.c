/* Simulator throughput and memory: for each trace file given and each seed policy, one
 * `sim_run` over a streamed trace (trace_stream: rows read block by block) in a child process,
 * printing routed (token, layer, slot) activations per second of the child's CPU time (the
 * machine is shared, so wall time would count other jobs), of the whole child ("all": opening
 * the stream checks its tokens' datasets) and of sim_run alone ("run"; it reads the rows it
 * needs as it goes and checks each block's values as it first reads it), and the child's peak RSS
 * (whole process: libraries, the stream's blocks and per-token arrays, the simulator's state).
 * Settings: the rtx3090-pcie4 profile, batch.size = 4, timeline off, everything else default.
 *
 * Traces come from `moesim trace synth -o` (bench/bench_sim.sh makes 10^4, 10^5 and 10^6-token
 * Qwen3-30B-A3B ones). Targets: lru >= 10 M activations/s, every seed policy >= 5 M/s,
 * peak RSS within 10 % between 10^5 and 10^6 tokens. The throughput against `trace stats` on
 * the same routing (the ratio column, with and without look-ahead rows, batches 1 and 4) is
 * bench/bench_lookahead.sh's.
 * Usage: bench_sim TRACE.h5 [TRACE.h5 ...] [-p POLICY ...] */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "sim/sim.h"
#include "traces/trace.h"

#define BENCH_MAX_POLICIES 16

/* The seed policies (the four papers' and the baselines they compare with). */
static const char *const seed_policies[] = {"lru",    "lfu",   "ondemand", "mixtral-offload",
                                            "oracle", "dymoe", "dynaexq",  "firm-moe"};

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* In the child: open, run, write "activations cpu_s" to fd. Exit status 0 on success. */
static int child_run(const char *path, const char *policy_name, int fd) {
    moesim_error err = {0};
    double c0 = cpu_s();
    trace_stream *ts = NULL;
    hw_profile hw;
    model_geometry m;
    quant_table q;
    config *c = config_create();
    config_set(c, "batch.size=4", &err);
    trace_stream_options rows = sim_stream_options(NULL, policy_name, c); /* as moesim sim does */
    if (trace_stream_open_with(path, &rows, &ts, &err) ||
        hw_load_by_name("rtx3090-pcie4", &hw, &err) ||
        model_load_by_name(trace_stream_tokens(ts)->meta.model, &m, &err) ||
        quant_table_load_default(&q, &err)) {
        fprintf(stderr, "bench_sim: %s\n", err.msg);
        return 1;
    }
    const trace *t = trace_stream_tokens(ts);
    sim_inputs in = {.trace = t, .stream = ts, .model = &m, .hw = &hw, .quant = &q};
    sim_result r;
    double c1 = cpu_s();
    if (sim_run(&in, policy_name, c, &r, &err)) {
        fprintf(stderr, "bench_sim: %s: %s\n", policy_name, err.msg);
        return 1;
    }
    double c2 = cpu_s();
    double acts = (double)t->n_tokens * m.n_moe_layers * m.top_k;
    dprintf(fd, "%.0f %.6f %.6f %" PRIu64 "\n", acts, c2 - c0, c2 - c1, t->n_tokens);
    config_destroy(c);
    trace_stream_close(ts);
    return 0;
}

int main(int argc, char **argv) {
    const char *traces[64], *policies[BENCH_MAX_POLICIES];
    size_t n_traces = 0, n_policies = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-p") && i + 1 < argc && n_policies < BENCH_MAX_POLICIES)
            policies[n_policies++] = argv[++i];
        else if (n_traces < 64)
            traces[n_traces++] = argv[i];
    }
    if (!n_traces) { /* bench/run.sh calls every benchmark bare */
        printf("bench_sim: no trace given (usage: bench_sim TRACE.h5 ... [-p POLICY ...]); "
               "bench/bench_sim.sh synthesizes them and runs it\n");
        return 0;
    }
    if (!n_policies)
        for (size_t i = 0; i < sizeof seed_policies / sizeof *seed_policies; i++)
            policies[n_policies++] = seed_policies[i];
    printf("bench_sim: rtx3090-pcie4, batch 4, streamed traces, one process per run\n");
    printf("%-10s %-16s %10s %14s %14s %10s\n", "tokens", "policy", "CPU s", "M act/s all",
           "M act/s run", "peak MB");
    for (size_t ti = 0; ti < n_traces; ti++)
        for (size_t pi = 0; pi < n_policies; pi++) {
            int fds[2];
            if (pipe(fds)) return 1;
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                close(fds[0]);
                _exit(child_run(traces[ti], policies[pi], fds[1]));
            }
            close(fds[1]);
            char buf[128] = "";
            ssize_t got = read(fds[0], buf, sizeof buf - 1);
            close(fds[0]);
            int status;
            struct rusage ru;
            if (wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) ||
                got <= 0) {
                printf("%-10s %-16s failed\n", "?", policies[pi]);
                continue;
            }
            double acts, dc, dr;
            uint64_t n;
            if (sscanf(buf, "%lf %lf %lf %" SCNu64, &acts, &dc, &dr, &n) != 4) return 1;
            printf("%-10" PRIu64 " %-16s %10.2f %14.2f %14.2f %10.1f\n", n, policies[pi], dc,
                   acts / dc / 1e6, acts / dr / 1e6, (double)ru.ru_maxrss / 1024.0);
        }
    return 0;
}
