/*
 * test_prom: the metrics registry and its exposition text (common/prom.h): the exact text of
 * counters, gauges with labels, a histogram; escaping of label values and help; NaN and the
 * infinities; refused registrations; NULL series; and a scrape while four threads update --
 * the counters read by successive scrapes never go down and end at the exact sums (the
 * sanitizer build checks the memory of that).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/prom.h"
#include "test.h"

static char *text_of(zs_prom *r)
{
    char *t = NULL;
    size_t n = 0;
    CHECK_OK(zs_prom_write(r, &t, &n));
    CHECK_EQ_INT(n, t ? strlen(t) : 0);
    return t;
}

#define CHECK_TEXT(got, want)                                                                      \
    do {                                                                                           \
        zs_test_checks++;                                                                          \
        if (strcmp((got), (want)) != 0) {                                                          \
            zs_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: text differs:\n--- got\n%s--- want\n%s---\n", __FILE__,        \
                    __LINE__, (got), (want));                                                      \
        }                                                                                          \
    } while (0)

static void test_format(void)
{
    zs_prom *r;
    CHECK_OK(zs_prom_open(&r));
    zs_prom_series *c = zs_prom_counter(r, "zs_test_bytes_total", "Bytes\\sent\nby us", NULL);
    const char *la[] = {"role", "server", "state", "live", NULL};
    const char *lb[] = {"role", "wo\"rk\\er\nx", "state", "gone", NULL};
    zs_prom_series *ga = zs_prom_gauge(r, "zs_test_members", "Members \"by\" state", la);
    zs_prom_series *gb = zs_prom_gauge(r, "zs_test_members", "Members \"by\" state", lb);
    zs_prom_series *nan = zs_prom_gauge(r, "zs_test_loss", "Loss", NULL);
    const double bounds[] = {0.1, 1, 2.5};
    zs_prom_series *h = zs_prom_histogram(r, "zs_test_seconds", "Durations", NULL, bounds, 3);
    CHECK(c && ga && gb && nan && h);
    zs_prom_add(c, 3);
    zs_prom_add(c, 4);
    zs_prom_set(ga, 2);
    zs_prom_set(gb, -0.5);
    zs_prom_gauge_add(gb, 1.0);
    zs_prom_set(nan, NAN);
    zs_prom_observe(h, 0.05);
    zs_prom_observe(h, 0.1); /* on the bound: its own bucket (le) */
    zs_prom_observe(h, 2);
    zs_prom_observe(h, 100);
    char *t = text_of(r);
    const char *want = "# HELP zs_test_bytes_total Bytes\\\\sent\\nby us\n"
                       "# TYPE zs_test_bytes_total counter\n"
                       "zs_test_bytes_total 7\n"
                       "# HELP zs_test_members Members \"by\" state\n"
                       "# TYPE zs_test_members gauge\n"
                       "zs_test_members{role=\"server\",state=\"live\"} 2\n"
                       "zs_test_members{role=\"wo\\\"rk\\\\er\\nx\",state=\"gone\"} 0.5\n"
                       "# HELP zs_test_loss Loss\n"
                       "# TYPE zs_test_loss gauge\n"
                       "zs_test_loss NaN\n"
                       "# HELP zs_test_seconds Durations\n"
                       "# TYPE zs_test_seconds histogram\n"
                       "zs_test_seconds_bucket{le=\"0.1\"} 2\n"
                       "zs_test_seconds_bucket{le=\"1\"} 2\n"
                       "zs_test_seconds_bucket{le=\"2.5\"} 3\n"
                       "zs_test_seconds_bucket{le=\"+Inf\"} 4\n"
                       "zs_test_seconds_sum 102.15\n"
                       "zs_test_seconds_count 4\n";
    if (t)
        CHECK_TEXT(t, want);
    free(t);
    CHECK_NEAR(zs_prom_value(c), 7, 0);
    CHECK_NEAR(zs_prom_value(gb), 0.5, 0);
    CHECK_NEAR(zs_prom_value(h), 4, 0);

    /* Infinities, and a value that needs 17 digits to read back. */
    zs_prom_set(nan, INFINITY);
    zs_prom_set(ga, 0.1 + 0.2);
    t = text_of(r);
    CHECK(t && strstr(t, "\nzs_test_loss +Inf\n"));
    CHECK(t && strstr(t, "{role=\"server\",state=\"live\"} 0.30000000000000004\n"));
    free(t);
    zs_prom_set(nan, -INFINITY);
    t = text_of(r);
    CHECK(t && strstr(t, "\nzs_test_loss -Inf\n"));
    free(t);

    /* Updates of the wrong kind or of no series do nothing. */
    zs_prom_set(c, 100);
    zs_prom_add(ga, 5);
    zs_prom_observe(c, 1);
    zs_prom_add(NULL, 1);
    zs_prom_set(NULL, 1);
    zs_prom_gauge_add(NULL, 1);
    zs_prom_observe(NULL, 1);
    CHECK_NEAR(zs_prom_value(c), 7, 0);
    CHECK(isnan(zs_prom_value(NULL)));
    zs_prom_free(r);
    zs_prom_free(NULL);
}

static void test_refused(void)
{
    zs_prom *r;
    CHECK_OK(zs_prom_open(&r));
    const char *l[] = {"a", "1", NULL};
    CHECK(zs_prom_gauge(r, "ok_name", "h", l));
    CHECK(!zs_prom_gauge(r, "ok_name", "h", l));
    CHECK(strstr(zs_last_error(), "registered twice"));
    CHECK(!zs_prom_counter(r, "ok_name", "h", NULL));
    CHECK(strstr(zs_last_error(), "another type or help"));
    CHECK(!zs_prom_gauge(r, "ok_name", "other help", NULL));
    CHECK(strstr(zs_last_error(), "another type or help"));
    CHECK(!zs_prom_gauge(r, "9starts_with_digit", "h", NULL));
    CHECK(strstr(zs_last_error(), "is not a metric name"));
    CHECK(!zs_prom_gauge(r, "has-dash", "h", NULL));
    CHECK(!zs_prom_gauge(r, "", "h", NULL));
    CHECK(!zs_prom_gauge(r, NULL, "h", NULL));
    CHECK(!zs_prom_gauge(r, "no_help", NULL, NULL));
    const char *bad_key[] = {"bad:key", "v", NULL};
    CHECK(!zs_prom_gauge(r, "g2", "h", bad_key));
    CHECK(strstr(zs_last_error(), "is not a label name"));
    const char *reserved[] = {"__name__", "v", NULL};
    CHECK(!zs_prom_gauge(r, "g2", "h", reserved));
    const char *le[] = {"le", "1", NULL};
    CHECK(!zs_prom_histogram(r, "h2", "h", le, (const double[]){1}, 1));
    CHECK(zs_prom_gauge(r, "g_le", "h", le)); /* only a histogram reserves le */
    const char *no_value[] = {"k", NULL, NULL};
    CHECK(!zs_prom_gauge(r, "g3", "h", no_value));
    const char *many[] = {"a", "1", "b", "2", "c", "3", "d", "4", "e", "5", NULL};
    CHECK(!zs_prom_gauge(r, "g4", "h", many));
    CHECK(strstr(zs_last_error(), "labels"));
    CHECK(!zs_prom_histogram(r, "h3", "h", NULL, (const double[]){2, 1}, 2));
    CHECK(strstr(zs_last_error(), "increasing"));
    CHECK(!zs_prom_histogram(r, "h4", "h", NULL, (const double[]){1, INFINITY}, 2));
    CHECK(!zs_prom_histogram(r, "h5", "h", NULL, (const double[]){1}, ZS_PROM_MAX_BUCKETS + 1));
    /* A refused registration leaves no family behind. */
    char *t = text_of(r);
    CHECK(t && !strstr(t, "g2") && !strstr(t, "h3") && strstr(t, "ok_name{a=\"1\"} 0\n"));
    free(t);
    CHECK_OK(zs_prom_add_process(r, "coord"));
    t = text_of(r);
    CHECK(t && strstr(t, "zshard_build_info{version=\"" ZS_VERSION "\",role=\"coord\"} 1\n"));
    CHECK(t && strstr(t, "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1"));
    free(t);
    zs_prom_free(r);
}

/* Four threads update while this one scrapes: every scrape parses, each counter it reads is
 * at least the previous scrape's, and at the end the counts are exact. */
#define WRITERS 4
#define ROUNDS 200000
typedef struct {
    zs_prom_series *c, *g, *h;
    atomic_int finished; /* writers done */
} shared;

static void *writer(void *arg)
{
    shared *s = arg;
    for (int i = 0; i < ROUNDS; i++) {
        zs_prom_add(s->c, 2);
        zs_prom_gauge_add(s->g, 1.0);
        zs_prom_observe(s->h, (double)(i % 10));
    }
    atomic_fetch_add(&s->finished, 1);
    return NULL;
}

static double read_value(const char *t, const char *series)
{
    const char *p = strstr(t, series);
    return p ? strtod(p + strlen(series), NULL) : -1;
}

/* zs_prom_register: every definition registered in order, of its type; the first refused one
 * fails the call, named, and those after it are not registered. */
static void test_register(void)
{
    zs_prom *r = NULL;
    CHECK_OK(zs_prom_open(&r));
    zs_prom_series *c = NULL, *g = NULL, *bad = NULL, *after = NULL;
    const zs_prom_def defs[] = {{&c, 0, "t_count_total", "a counter"},
                                {&g, 1, "t_gauge", "a gauge"}};
    CHECK_OK(zs_prom_register(r, defs, 2));
    CHECK(c && g);
    zs_prom_add(c, 3);
    zs_prom_set(g, 2.5);
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(zs_prom_write(r, &text, &len));
    CHECK(text && strstr(text, "# TYPE t_count_total counter\nt_count_total 3\n"));
    CHECK(text && strstr(text, "# TYPE t_gauge gauge\nt_gauge 2.5\n"));
    free(text);
    const zs_prom_def refused[] = {{&bad, 1, "t-bad", "a bad name"},
                                   {&after, 0, "t_after_total", "x"}};
    CHECK_FAILS_WITH(zs_prom_register(r, refused, 2), "\"t-bad\" is not a metric name");
    CHECK(bad == NULL && after == NULL);
    zs_prom_free(r);
}

static void test_concurrent(void)
{
    zs_prom *r;
    CHECK_OK(zs_prom_open(&r));
    shared s;
    atomic_init(&s.finished, 0);
    const double bounds[] = {1, 5};
    s.c = zs_prom_counter(r, "zs_c_total", "c", NULL);
    s.g = zs_prom_gauge(r, "zs_g", "g", NULL);
    s.h = zs_prom_histogram(r, "zs_h", "h", NULL, bounds, 2);
    pthread_t th[WRITERS];
    for (int i = 0; i < WRITERS; i++)
        pthread_create(&th[i], NULL, writer, &s);
    double last_c = 0, last_n = 0;
    int scrapes = 0, during = 0, monotonic = 1, consistent = 1;
    /* Scrapes until the writers are done, at least 200. */
    for (int k = 0; k < 200 || atomic_load(&s.finished) < WRITERS; k++) {
        during += atomic_load(&s.finished) < WRITERS;
        /* Series registered while the writers run. */
        if (k < 20) {
            char name[32];
            snprintf(name, sizeof name, "zs_late_%d", k);
            CHECK(zs_prom_gauge(r, name, "late", NULL));
        }
        char *t = NULL;
        size_t n;
        if (zs_prom_write(r, &t, &n) != ZS_OK)
            break;
        double c = read_value(t, "\nzs_c_total ");
        double inf = read_value(t, "zs_h_bucket{le=\"+Inf\"} ");
        double cnt = read_value(t, "\nzs_h_count ");
        monotonic &= c >= last_c && cnt >= last_n;
        consistent &= inf == cnt; /* one scrape: le="+Inf" is the count */
        last_c = c;
        last_n = cnt;
        scrapes++;
        free(t);
    }
    for (int i = 0; i < WRITERS; i++)
        pthread_join(th[i], NULL);
    CHECK(scrapes >= 200);
    CHECK(during > 0);
    printf("test_prom: %d scrapes, %d of them while the writers ran\n", scrapes, during);
    CHECK(monotonic);
    CHECK(consistent);
    char *t = text_of(r);
    CHECK_NEAR(read_value(t, "\nzs_c_total "), 2.0 * WRITERS * ROUNDS, 0);
    CHECK_NEAR(read_value(t, "\nzs_g "), (double)WRITERS * ROUNDS, 0);
    CHECK_NEAR(read_value(t, "\nzs_h_count "), (double)WRITERS * ROUNDS, 0);
    /* i % 10 in 0..9: le 1 holds 0 and 1, le 5 holds 0..5; the sum is 45 per 10. */
    CHECK_NEAR(read_value(t, "zs_h_bucket{le=\"1\"} "), WRITERS * ROUNDS / 10 * 2, 0);
    CHECK_NEAR(read_value(t, "zs_h_bucket{le=\"5\"} "), WRITERS * ROUNDS / 10 * 6, 0);
    CHECK_NEAR(read_value(t, "\nzs_h_sum "), WRITERS * ROUNDS / 10 * 45.0, 0);
    CHECK(strstr(t, "zs_late_19 0\n"));
    free(t);
    zs_prom_free(r);
}

int main(void)
{
    test_format();
    test_refused();
    test_register();
    test_concurrent();
    return zs_test_result("test_prom");
}
