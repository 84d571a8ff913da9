/* Messages to stderr for people (progress notes, warnings). Results go to stdout or files, never
 * here. The verbosity is an explicit argument of each command, not a global: callers pass a
 * log_level they got from the command line. */
#ifndef MOESIM_COMMON_LOG_H
#define MOESIM_COMMON_LOG_H

typedef enum log_level { LOG_QUIET = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 } log_level;

void log_msg(log_level current, log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_warn(cur, ...) log_msg((cur), LOG_WARN, __VA_ARGS__)
#define log_info(cur, ...) log_msg((cur), LOG_INFO, __VA_ARGS__)
#define log_debug(cur, ...) log_msg((cur), LOG_DEBUG, __VA_ARGS__)

#endif
