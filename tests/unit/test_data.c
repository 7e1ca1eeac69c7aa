/*
 * data: llm.c shards (and their corruptions), text and directories, deterministic chunks;
 * anything but a regular file or a directory of them (a FIFO, a device, a socket, a
 * subdirectory) is refused by name, without blocking.
 */
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/data.h"
#include "tests/unit/test.h"

static char dir[] = "/tmp/zs_test_data_XXXXXX";

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK(fwrite(p, 1, n, f) == n);
    fclose(f);
}

static void test_llmc(void)
{
    char p[256];
    path_of(p, sizeof p, "ok.bin");
    uint16_t toks[1000];
    for (int i = 0; i < 1000; i++)
        toks[i] = (uint16_t)((i * 37) % 50257);
    CHECK_OK(zs_data_write_llmc(p, toks, 1000));
    zs_dataset ds;
    CHECK_OK(zs_data_open(p, &ds));
    CHECK_EQ_INT(ds.kind, ZS_DATA_LLMC);
    CHECK_EQ_INT(ds.ntokens, 1000);
    CHECK(memcmp(ds.tokens, toks, sizeof toks) == 0);
    CHECK_OK(zs_data_check(&ds, 50257, 64));
    CHECK_FAILS_WITH(zs_data_check(&ds, 256, 64), "outside the model's vocab_size 256");
    CHECK_FAILS_WITH(zs_data_check(&ds, 50257, 1000), "needs at least 1001");
    zs_data_close(&ds);

    /* Truncated: the header promises more tokens than the file holds. */
    int32_t header[256] = {ZS_LLMC_MAGIC, 1, 1000};
    uint8_t buf[1024 + 2000];
    memcpy(buf, header, sizeof header);
    memcpy(buf + 1024, toks, 2000);
    path_of(p, sizeof p, "short.bin");
    write_bytes(p, buf, sizeof buf - 10);
    CHECK_FAILS_WITH(zs_data_open(p, &ds), "header says 1000 tokens (3024 bytes), file has 3014");
    /* Trailing bytes are as wrong as missing ones. */
    header[2] = 900;
    memcpy(buf, header, sizeof header);
    path_of(p, sizeof p, "long.bin");
    write_bytes(p, buf, sizeof buf);
    CHECK_FAILS_WITH(zs_data_open(p, &ds), "header says 900 tokens");
    header[1] = 2;
    header[2] = 1000;
    memcpy(buf, header, sizeof header);
    path_of(p, sizeof p, "v2.bin");
    write_bytes(p, buf, sizeof buf);
    CHECK_FAILS_WITH(zs_data_open(p, &ds), "version 2, expected 1");
    header[1] = 1;
    header[2] = -5;
    memcpy(buf, header, sizeof header);
    path_of(p, sizeof p, "neg.bin");
    write_bytes(p, buf, sizeof buf);
    CHECK_FAILS_WITH(zs_data_open(p, &ds), "negative token count");
    CHECK_FAILS_WITH(zs_data_open("/nonexistent/data.bin", &ds), "/nonexistent/data.bin");
}

static void test_text_and_dirs(void)
{
    char sub[200], p[256];
    path_of(sub, sizeof sub, "text");
    CHECK(mkdir(sub, 0777) == 0);
    snprintf(p, sizeof p, "%s/b.txt", sub);
    write_bytes(p, "world", 5);
    snprintf(p, sizeof p, "%s/a.txt", sub);
    write_bytes(p, "hello ", 6);
    snprintf(p, sizeof p, "%s/.hidden", sub);
    write_bytes(p, "XXXX", 4);
    zs_dataset ds;
    CHECK_OK(zs_data_open(sub, &ds));
    CHECK_EQ_INT(ds.kind, ZS_DATA_TEXT);
    CHECK_EQ_INT(ds.n_files, 2);
    CHECK_EQ_INT(ds.ntokens, 11);
    const char *want = "hello world";
    int same = 1;
    for (int i = 0; i < 11; i++)
        same &= ds.tokens[i] == (uint8_t)want[i];
    CHECK(same);
    CHECK_EQ_INT(ds.max_token, 'w');
    uint64_t fp = ds.fingerprint;
    zs_data_close(&ds);
    /* The same text in one file: the same tokens, the same fingerprint. */
    path_of(p, sizeof p, "one.txt");
    write_bytes(p, "hello world", 11);
    CHECK_OK(zs_data_open(p, &ds));
    CHECK(ds.fingerprint == fp);
    zs_data_close(&ds);
    path_of(p, sizeof p, "other.txt");
    write_bytes(p, "hello worle", 11);
    CHECK_OK(zs_data_open(p, &ds));
    CHECK(ds.fingerprint != fp);
    zs_data_close(&ds);
    /* A directory mixing formats is refused. */
    uint16_t toks[300] = {0};
    snprintf(p, sizeof p, "%s/c.bin", sub);
    CHECK_OK(zs_data_write_llmc(p, toks, 300));
    CHECK_FAILS_WITH(zs_data_open(sub, &ds), "earlier files are text");
    path_of(p, sizeof p, "empty.txt");
    write_bytes(p, "", 0);
    CHECK_FAILS_WITH(zs_data_open(p, &ds), "holds no tokens");
}

/* Opening a FIFO for reading waits for a writer: were zs_data_open to do that, it would never
 * return, and the alarm set in main ends the test (a failure) instead of a hang. */
static void test_not_regular(void)
{
    char p[256], sub[200], q[256];
    zs_dataset ds;
    path_of(p, sizeof p, "fifo");
    CHECK(mkfifo(p, 0600) == 0);
    CHECK_FAILS_WITH(zs_data_open(p, &ds), "is a FIFO; --data must be a regular file or a");
    CHECK_FAILS_WITH(zs_data_open(p, &ds), p);
    CHECK(ds.tokens == NULL);
    CHECK_FAILS_WITH(zs_data_open("/dev/null", &ds), "data /dev/null: is a character device");

    /* A socket. */
    char sp[100]; /* fits sun_path */
    path_of(sp, sizeof sp, "sock");
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sp);
    CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK_FAILS_WITH(zs_data_open(sp, &ds), "is a socket");
    close(fd);

    /* In a directory: each entry that is not a regular file is named, not skipped. */
    path_of(sub, sizeof sub, "withfifo");
    CHECK(mkdir(sub, 0777) == 0);
    snprintf(q, sizeof q, "%s/a.txt", sub);
    write_bytes(q, "hello world, hello data", 23);
    CHECK_OK(zs_data_open(sub, &ds));
    zs_data_close(&ds);
    snprintf(q, sizeof q, "%s/b.fifo", sub);
    CHECK(mkfifo(q, 0600) == 0);
    CHECK_FAILS_WITH(zs_data_open(sub, &ds), q);
    CHECK_FAILS_WITH(zs_data_open(sub, &ds), "b.fifo: is a FIFO");
    CHECK(unlink(q) == 0);
    snprintf(q, sizeof q, "%s/nested", sub);
    CHECK(mkdir(q, 0777) == 0);
    CHECK_FAILS_WITH(zs_data_open(sub, &ds), "nested: is a directory");
    CHECK(rmdir(q) == 0);
    /* A link to a regular file is one; a dangling link is an error that names it. */
    snprintf(q, sizeof q, "%s/c.txt", sub);
    path_of(p, sizeof p, "one.txt");
    CHECK(symlink(p, q) == 0);
    CHECK_OK(zs_data_open(sub, &ds));
    CHECK_EQ_INT(ds.n_files, 2);
    zs_data_close(&ds);
    CHECK(unlink(q) == 0);
    snprintf(q, sizeof q, "%s/d.txt", sub);
    CHECK(symlink("/nonexistent/zs_data", q) == 0);
    CHECK_FAILS_WITH(zs_data_open(sub, &ds), "d.txt: No such file or directory");
    CHECK(unlink(q) == 0);
    /* Hidden entries are still skipped, whatever they are. */
    snprintf(q, sizeof q, "%s/.fifo", sub);
    CHECK(mkfifo(q, 0600) == 0);
    CHECK_OK(zs_data_open(sub, &ds));
    CHECK_EQ_INT(ds.n_files, 1);
    zs_data_close(&ds);
}

static void test_chunks(void)
{
    zs_dataset ds = {0};
    ds.ntokens = 5000;
    ds.tokens = malloc(ds.ntokens * sizeof *ds.tokens);
    for (size_t i = 0; i < ds.ntokens; i++)
        ds.tokens[i] = (uint16_t)(i % 251);
    enum { B = 3, T = 16 };
    int32_t in1[B * T], tg1[B * T], in2[B * T], tg2[B * T];
    zs_data_chunk(&ds, 42, 7, 2, B, T, in1, tg1);
    zs_data_chunk(&ds, 42, 7, 2, B, T, in2, tg2);
    CHECK(memcmp(in1, in2, sizeof in1) == 0 && memcmp(tg1, tg2, sizeof tg1) == 0);
    /* Targets are the inputs shifted by one. */
    int shifted = 1;
    for (int j = 0; j < B; j++)
        for (int k = 0; k + 1 < T; k++)
            shifted &= tg1[j * T + k] == in1[j * T + k + 1];
    CHECK(shifted);
    /* Other step, chunk or seed: other sequences. */
    zs_data_chunk(&ds, 42, 8, 2, B, T, in2, tg2);
    CHECK(memcmp(in1, in2, sizeof in1) != 0);
    zs_data_chunk(&ds, 42, 7, 3, B, T, in2, tg2);
    CHECK(memcmp(in1, in2, sizeof in1) != 0);
    zs_data_chunk(&ds, 43, 7, 2, B, T, in2, tg2);
    CHECK(memcmp(in1, in2, sizeof in1) != 0);
    /* Eval sequences: stride T. */
    CHECK_EQ_INT(zs_data_eval_count(&ds, T), (5000 - 1) / T);
    zs_data_eval_seq(&ds, 2, T, in1, tg1);
    CHECK_EQ_INT(in1[0], (2 * T) % 251);
    CHECK_EQ_INT(tg1[T - 1], (3 * T) % 251);
    free(ds.tokens);
}

int main(void)
{
    CHECK(mkdtemp(dir) != NULL);
    test_llmc();
    test_text_and_dirs();
    alarm(60);
    test_not_regular();
    alarm(0);
    test_chunks();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return zs_test_result("test_data");
}
