/*
 * log: leveled logging to stderr.
 *
 * One line per call: "2026-12-02T12:00:00.123Z zshard[1234] INFO message".  The level comes
 * from zs_log_set_level() (the CLI's --log-level) or the ZS_LOG environment variable
 * (error, warn, info, debug); the default is info.  Thread-safe: each line is written with a
 * single write so lines from different threads do not interleave.
 */
#ifndef ZS_LOG_H
#define ZS_LOG_H

typedef enum { ZS_LOG_ERROR = 0, ZS_LOG_WARN = 1, ZS_LOG_INFO = 2, ZS_LOG_DEBUG = 3 } zs_log_level;

void zs_log_set_level(zs_log_level level);
/* Parses "error", "warn", "info" or "debug"; returns -1 for anything else. */
int zs_log_parse_level(const char *name);
zs_log_level zs_log_get_level(void);
void zs_log(zs_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Rate-limited logging for what a peer can make happen as often as it likes (refused
 * connections, malformed messages, EMFILE): at most ZS_LOG_LIMIT_LINES lines per
 * ZS_LOG_LIMIT_WINDOW_MS per limiter; the first line after a window that dropped some says
 * how many ("(37 more like this in the last 10 s)").  A limiter is used by one thread (no
 * lock inside); zero-initialise it (static or ZS_LOG_LIMIT_INIT).
 */
#define ZS_LOG_LIMIT_LINES 5
#define ZS_LOG_LIMIT_WINDOW_MS 10000
typedef struct {
    unsigned long long window_start_ms; /* monotonic ms when the current window began */
    unsigned lines;                     /* lines printed in the current window */
    unsigned long long dropped;         /* lines dropped since the last one printed */
} zs_log_limit;
#define ZS_LOG_LIMIT_INIT                                                                          \
    {                                                                                              \
        0, 0, 0                                                                                    \
    }

void zs_log_limited(zs_log_limit *lim, zs_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ZS_ERROR(...) zs_log(ZS_LOG_ERROR, __VA_ARGS__)
#define ZS_WARN(...) zs_log(ZS_LOG_WARN, __VA_ARGS__)
#define ZS_INFO(...) zs_log(ZS_LOG_INFO, __VA_ARGS__)
#define ZS_DEBUG(...) zs_log(ZS_LOG_DEBUG, __VA_ARGS__)

#endif
