/* Hugging Face safetensors files: header parsing with every field checked, and memory mapping.
 *
 * File layout: an 8-byte little-endian header length N, N bytes of JSON (an object mapping tensor
 * names to {"dtype", "shape", "data_offsets": [begin, end]} plus an optional "__metadata__" object
 * of strings), then the data region; offsets are relative to the data region. The parser accepts
 * F32, F16 and BF16 tensors of up to SAFETENSORS_MAX_DIMS dimensions and checks: N fits the file,
 * the JSON is an object of well-formed entries, end - begin equals the element count times the
 * dtype size (without overflow), every range lies inside the data region, and ranges do not
 * overlap. Any violation is one moesim_error naming the file and the tensor; never a crash. */
#ifndef MOESIM_ENGINE_SAFETENSORS_H
#define MOESIM_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define SAFETENSORS_MAX_DIMS 4
#define SAFETENSORS_MAX_NAME 160
#define SAFETENSORS_MAX_HEADER_BYTES (100u << 20) /* the format's own limit is 100 MB */

typedef enum st_dtype { ST_F32 = 0, ST_F16, ST_BF16 } st_dtype;

typedef struct st_tensor {
    char name[SAFETENSORS_MAX_NAME];
    st_dtype dtype;
    uint32_t n_dims;
    uint64_t shape[SAFETENSORS_MAX_DIMS]; /* [n_dims], outermost first */
    uint64_t n_elems;
    uint64_t offset_bytes; /* into the data region */
    uint64_t size_bytes;
    const void *data; /* into the mapping (NULL until mapped) */
} st_tensor;

typedef struct st_file st_file;

/* Parses a whole file image held in memory (`buf` of `len` bytes: length prefix, header, data).
 * On success *tensors (caller frees with free()) holds *n_tensors entries sorted by name, with
 * data pointing into buf. `what` names the file in messages. Used by st_file_open and the fuzzer. */
moesim_status st_parse(const uint8_t *buf, size_t len, const char *what, st_tensor **tensors,
                       size_t *n_tensors, moesim_error *err);

/* Maps `path` read-only and parses it. Caller owns; st_file_close. */
moesim_status st_file_open(const char *path, st_file **out, moesim_error *err);
void st_file_close(st_file *f); /* accepts NULL */
size_t st_file_count(const st_file *f);
const st_tensor *st_file_tensor(const st_file *f, size_t i);
const st_tensor *st_file_find(const st_file *f, const char *name); /* NULL when absent */
const char *st_dtype_name(st_dtype d);
size_t st_dtype_size(st_dtype d);

#endif
