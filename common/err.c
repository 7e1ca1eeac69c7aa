#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ZS_ERRMSG_MAX 1024

static _Thread_local char errmsg[ZS_ERRMSG_MAX];

zs_err zs_error(zs_err code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return code;
}

zs_err zs_error_context(zs_err code, const char *fmt, ...)
{
    char prefix[ZS_ERRMSG_MAX];
    char old[ZS_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errmsg, sizeof old);
    /* Build "prefix: old" by pieces; both are truncated to fit the buffer. */
    size_t n = strnlen(prefix, sizeof errmsg - 3);
    memcpy(errmsg, prefix, n);
    memcpy(errmsg + n, ": ", 2);
    n += 2;
    size_t m = strnlen(old, sizeof errmsg - 1 - n);
    memcpy(errmsg + n, old, m);
    errmsg[n + m] = '\0';
    return code;
}

const char *zs_last_error(void)
{
    return errmsg;
}

const char *zs_err_name(zs_err code)
{
    switch (code) {
    case ZS_OK:
        return "ok";
    case ZS_ERR_INVALID:
        return "invalid";
    case ZS_ERR_IO:
        return "io";
    case ZS_ERR_NOMEM:
        return "nomem";
    case ZS_ERR_FORMAT:
        return "format";
    case ZS_ERR_NOTFOUND:
        return "notfound";
    case ZS_ERR_INTERNAL:
        return "internal";
    case ZS_ERR_UNSUPPORTED:
        return "unsupported";
    }
    return "unknown";
}
