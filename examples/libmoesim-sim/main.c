/* libmoesim example: validates a trace, simulates it under a policy and prints the result's JSON
 * (the object `moesim sim --json` prints for the same inputs; the caller parses it with the JSON
 * library of its choice).
 *
 *   usage: libmoesim_sim TRACE.h5 HW POLICY [section.key=value ...]
 *
 * Build against an installed moesim:  cc main.c $(pkg-config --cflags --libs moesim) */
#include <moesim.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TRACE.h5 HW POLICY [section.key=value ...]\n", argv[0]);
        return 2;
    }
    if (moesim_abi_version() != MOESIM_ABI_VERSION) {
        fprintf(stderr, "libmoesim ABI %d, this program was built for %d\n", moesim_abi_version(),
                MOESIM_ABI_VERSION);
        return 2;
    }
    char *json = NULL, *error = NULL;
    /* validate the trace first: its errors name the file and the field */
    if (moesim_trace_open(argv[1], NULL, &error)) {
        fprintf(stderr, "libmoesim_sim: %s\n", error);
        moesim_free(error);
        return 2;
    }
    const char *const *settings = (const char *const *)argv + 4;
    int st = moesim_sim(argv[1], argv[2], argv[3], NULL, NULL, settings, (size_t)(argc - 4), &json,
                        &error);
    if (st) {
        fprintf(stderr, "libmoesim_sim: %s\n", error);
        moesim_free(error);
        return 2;
    }
    puts(json);
    moesim_free(json);
    return 0;
}
