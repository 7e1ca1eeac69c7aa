/*
 * test.h: assertion macros for the unit tests.  A failed check prints the file, the line,
 * the expression and both values, counts the failure and goes on; a test executable
 * returns zs_test_result() from main, which is non-zero when any check failed.
 */
#ifndef ZS_TEST_H
#define ZS_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int zs_test_failures;
static int zs_test_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        zs_test_checks++;                                                                          \
        if (!(cond)) {                                                                             \
            zs_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long zs_a_ = (long long)(a), zs_b_ = (long long)(b);                                  \
        zs_test_checks++;                                                                          \
        if (zs_a_ != zs_b_) {                                                                      \
            zs_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld vs %lld\n", __FILE__, __LINE__, #a, #b,  \
                    zs_a_, zs_b_);                                                                 \
        }                                                                                          \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double zs_a_ = (double)(a), zs_b_ = (double)(b), zs_t_ = (double)(tol);                    \
        zs_test_checks++;                                                                          \
        if (!(fabs(zs_a_ - zs_b_) <= zs_t_)) {                                                     \
            zs_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: |%s - %s| <= %g failed: %.9g vs %.9g\n", __FILE__, __LINE__,   \
                    #a, #b, zs_t_, zs_a_, zs_b_);                                                  \
        }                                                                                          \
    } while (0)

/* The call returned ZS_OK; otherwise prints the recorded message. */
#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        int zs_r_ = (int)(call);                                                                   \
        zs_test_checks++;                                                                          \
        if (zs_r_ != 0) {                                                                          \
            zs_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #call, zs_r_,       \
                    zs_last_error());                                                              \
        }                                                                                          \
    } while (0)

/* The call failed, and its message contains the substring needle. */
#define CHECK_FAILS_WITH(call, needle)                                                             \
    do {                                                                                           \
        int zs_r_ = (int)(call);                                                                   \
        zs_test_checks++;                                                                          \
        if (zs_r_ == 0) {                                                                          \
            zs_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s succeeded, expected an error with \"%s\"\n", __FILE__,      \
                    __LINE__, #call, needle);                                                      \
        } else if (!strstr(zs_last_error(), needle)) {                                             \
            zs_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, #call, \
                    zs_last_error(), needle);                                                      \
        }                                                                                          \
    } while (0)

/* FNV-1a of n bytes: a payload's fingerprint, as test servers answer pushes with it. */
static inline unsigned long long zs_test_fnv(const unsigned char *p, size_t n)
{
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static inline int zs_test_result(const char *name)
{
    if (zs_test_failures) {
        fprintf(stderr, "%s: %d of %d checks failed\n", name, zs_test_failures, zs_test_checks);
        return 1;
    }
    printf("%s: %d checks passed\n", name, zs_test_checks);
    return 0;
}

#endif
