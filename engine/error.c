/* error.c - rlai_strerror: names for the engine's negative error codes. */
#include "rlai/error.h"

const char *rlai_strerror(int code)
{
    switch (code) {
    case RLAI_OK: return "success";
    case RLAI_ERR_NOMEM: return "out of memory";
    case RLAI_ERR_IO: return "I/O error (file could not be opened, read or mapped)";
    case RLAI_ERR_FORMAT: return "malformed input (file or data is corrupt or hostile)";
    case RLAI_ERR_UNSUPPORTED: return "unsupported feature, type or architecture";
    case RLAI_ERR_INVALID_ARG: return "invalid argument";
    case RLAI_ERR_CONTEXT_FULL: return "context length exceeded";
    case RLAI_ERR_KV_FULL: return "KV cache has no free blocks";
    case RLAI_ERR_CANCELLED: return "cancelled";
    case RLAI_ERR_NOT_FOUND: return "not found";
    case RLAI_ERR_NOT_IMPLEMENTED: return "not implemented in this build";
    case RLAI_ERR_TOKENIZER: return "text could not be tokenized";
    case RLAI_ERR_TOO_LARGE: return "input exceeds a configured limit";
    case RLAI_ERR_TIMEOUT: return "timed out";
    case RLAI_ERR_DISCONNECTED: return "engine not reachable or connection lost";
    case RLAI_ERR_BUSY: return "engine busy: too many requests in flight";
    case RLAI_ERR_PROTOCOL: return "protocol error: malformed or unexpected message";
    case RLAI_ERR_EXISTS: return "already exists (name taken)";
    case RLAI_ERR_ABI: return "incompatible plugin ABI version or build signature";
    default: return "unknown error";
    }
}
