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

#define ZS_ERROR(...) zs_log(ZS_LOG_ERROR, __VA_ARGS__)
#define ZS_WARN(...) zs_log(ZS_LOG_WARN, __VA_ARGS__)
#define ZS_INFO(...) zs_log(ZS_LOG_INFO, __VA_ARGS__)
#define ZS_DEBUG(...) zs_log(ZS_LOG_DEBUG, __VA_ARGS__)

#endif
