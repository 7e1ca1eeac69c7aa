#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

/* -1 means "not yet read from ZS_LOG". */
static atomic_int current_level = -1;

static const char *level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

int zs_log_parse_level(const char *name)
{
    static const char *lower[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(name, lower[i]) == 0)
            return i;
    return -1;
}

void zs_log_set_level(zs_log_level level)
{
    atomic_store(&current_level, (int)level);
}

zs_log_level zs_log_get_level(void)
{
    int level = atomic_load(&current_level);
    if (level < 0) {
        const char *env = getenv("ZS_LOG");
        level = env ? zs_log_parse_level(env) : -1;
        if (level < 0)
            level = ZS_LOG_INFO;
        atomic_store(&current_level, level);
    }
    return (zs_log_level)level;
}

/* Writes one line: timestamp, pid, level, then fmt with ap, then suffix. */
__attribute__((format(printf, 3, 0))) static void log_line(zs_log_level level, const char *suffix,
                                                           const char *fmt, va_list ap)
{
    char line[2048];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ zshard[%d] %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (int)(tv.tv_usec / 1000), (int)getpid(), level_names[level]);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    if (suffix && *suffix) {
        int k = snprintf(line + len, sizeof line - len - 1, "%s", suffix);
        len += k < 0 ? 0 : (size_t)k;
        if (len > sizeof line - 2)
            len = sizeof line - 2;
    }
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void zs_log(zs_log_level level, const char *fmt, ...)
{
    if ((int)level > (int)zs_log_get_level())
        return;
    va_list ap;
    va_start(ap, fmt);
    log_line(level, NULL, fmt, ap);
    va_end(ap);
}

void zs_log_limited(zs_log_limit *lim, zs_log_level level, const char *fmt, ...)
{
    if ((int)level > (int)zs_log_get_level())
        return;
    unsigned long long now = zs_now_ms();
    if (lim->lines == 0 || now - lim->window_start_ms >= ZS_LOG_LIMIT_WINDOW_MS) {
        lim->window_start_ms = now;
        lim->lines = 0;
    }
    if (lim->lines >= ZS_LOG_LIMIT_LINES) {
        lim->dropped++;
        return;
    }
    lim->lines++;
    char suffix[96] = "";
    if (lim->dropped)
        snprintf(suffix, sizeof suffix, " (%llu more like this were not logged)", lim->dropped);
    lim->dropped = 0;
    va_list ap;
    va_start(ap, fmt);
    log_line(level, suffix, fmt, ap);
    va_end(ap);
}
