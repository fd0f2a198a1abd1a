/* rlai/error.h - error codes shared by every RTX-LocalAI library: always
 * negative, 0 is success; rlai_strerror() gives a static description. */
#ifndef RLAI_ERROR_H
#define RLAI_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes: always negative. */
enum rlai_error {
    RLAI_OK = 0,
    RLAI_ERR_NOMEM = -1,           /* allocation failed */
    RLAI_ERR_IO = -2,              /* file could not be opened/read/mapped */
    RLAI_ERR_FORMAT = -3,          /* malformed or hostile file contents */
    RLAI_ERR_UNSUPPORTED = -4,     /* valid file, feature/type not supported */
    RLAI_ERR_INVALID_ARG = -5,     /* bad argument from the caller */
    RLAI_ERR_CONTEXT_FULL = -6,    /* prompt + generation exceed the context */
    RLAI_ERR_KV_FULL = -7,         /* no free KV cache blocks */
    RLAI_ERR_CANCELLED = -8,       /* stopped by the caller's callback */
    RLAI_ERR_NOT_FOUND = -9,       /* key/tensor/token not present */
    RLAI_ERR_NOT_IMPLEMENTED = -10,/* feature exists in the API but not built */
    RLAI_ERR_TOKENIZER = -11,      /* text could not be tokenized */
    RLAI_ERR_TOO_LARGE = -12,      /* input exceeds a configured limit */
    RLAI_ERR_TIMEOUT = -13,        /* nothing arrived in the time given */
    RLAI_ERR_DISCONNECTED = -14,   /* engine absent, died, or connection lost */
    RLAI_ERR_BUSY = -15,           /* too many requests in flight */
    RLAI_ERR_PROTOCOL = -16,       /* malformed or unexpected message */
    RLAI_ERR_EXISTS = -17,         /* name already registered / taken */
    RLAI_ERR_ABI = -18,            /* plugin built for an incompatible ABI */
};

/* Static English description of an error code; never NULL. */
const char *rlai_strerror(int code);

#ifdef __cplusplus
}
#endif
#endif
