/* libFuzzer harness for the safetensors header parser (engine/safetensors.c): any byte string is
 * a file image; st_parse must either accept it (then every tensor lies inside the image and the
 * ranges do not overlap) or return one error, and never crash, leak or read out of bounds.
 * Build and run: make fuzz (clang, -fsanitize=fuzzer,address,undefined; see tests/fuzz/README.md). */
#include <stdint.h>
#include <stdlib.h>

#include "common/check.h"
#include "engine/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_tensor *t = NULL;
    size_t n = 0;
    moesim_error err = {0};
    if (st_parse(data, size, "fuzz", &t, &n, &err) == MOESIM_OK) {
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = t[i].data;
            MOESIM_ASSERT(p >= data && p + t[i].size_bytes <= data + size);
            MOESIM_ASSERT(t[i].size_bytes == t[i].n_elems * st_dtype_size(t[i].dtype));
            if (t[i].size_bytes) (void)*(volatile const uint8_t *)(p + t[i].size_bytes - 1);
        }
    } else {
        MOESIM_ASSERT(err.msg[0] != '\0' && t == NULL);
    }
    free(t);
    return 0;
}
