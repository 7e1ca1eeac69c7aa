/*
 * zshard export: turns a checkpoint into a Hugging Face model directory (model.safetensors +
 * config.json, the files `zshard train` writes), streaming one shard file at a time so that
 * exporting a model never needs the model's size in memory.  The checkpoint is found and
 * verified as a resume would (zs_ckpt_resolve): a checkpoint directory means its newest valid
 * checkpoint.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/ckpt.h"
#include "common/clock.h"
#include "common/log.h"

static const char export_usage[] =
    "usage: zshard export CKPT --out DIR [--log-level LEVEL]\n"
    "\n"
    "Writes DIR/model.safetensors and DIR/config.json (Hugging Face GPT-2, loadable by\n"
    "from_pretrained and by zshard eval) from the weights of a checkpoint.  Every checksum\n"
    "of the checkpoint is verified first; a damaged checkpoint is refused with the file and\n"
    "the reason.  Progress goes to stderr.\n"
    "\n"
    "  CKPT               a step directory (DIR/step-00000050, with manifest.json), or a\n"
    "                     checkpoint directory: its newest valid checkpoint (`latest` first,\n"
    "                     then older step directories, with a warning for each one skipped)\n"
    "  --out DIR          where model.safetensors and config.json go (created if missing)\n"
    "  --log-level LEVEL  error, warn, info (default) or debug\n"
    "  -h, --help         this text\n";

/* At most one progress line per PROGRESS_S seconds. */
#define PROGRESS_S 1.0

typedef struct {
    double start, last;
} progress_state;

static void on_progress(void *user, uint64_t done, uint64_t total)
{
    progress_state *p = user;
    double now = zs_now_s();
    if (done >= total || now - p->last < PROGRESS_S)
        return;
    p->last = now;
    fprintf(stderr, "export: %3.0f%% (%.1f of %.1f MiB), %.1f s\n",
            total ? 100.0 * (double)done / (double)total : 100.0, (double)done / (1 << 20),
            (double)total / (1 << 20), now - p->start);
}

int zs_cmd_export(int argc, char **argv)
{
    static const struct option opts[] = {{"out", required_argument, NULL, 'o'},
                                         {"log-level", required_argument, NULL, 'l'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *out = NULL;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'l':
            if (zs_cli_log_level("export", optarg))
                return 2;
            break;
        case 'h':
            fputs(export_usage, stdout);
            return 0;
        case ':':
            return zs_cli_usage_error("export", "%s needs a value", argv[optind - 1]);
        default:
            return zs_cli_usage_error("export", "unknown option \"%s\"", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return zs_cli_usage_error("export", "missing CKPT (a step or checkpoint directory)");
    const char *path = argv[optind];
    if (optind + 1 < argc)
        return zs_cli_usage_error("export", "unexpected argument \"%s\"", argv[optind + 1]);
    if (!out)
        return zs_cli_usage_error("export", "missing --out");

    progress_state prog = {.start = zs_now_s()};
    zs_ckpt ck;
    ZS_INFO("export: verifying the checkpoint in %s", path);
    if (zs_ckpt_resolve(path, &ck) != ZS_OK) {
        fprintf(stderr, "zshard export: %s\n", zs_last_error());
        return 1;
    }
    ZS_INFO("export: %s: step %ld of run %016llx, %zu parameters in %d shard files, verified "
            "in %.1f s",
            ck.step_dir, ck.info.step, (unsigned long long)ck.info.run_id, ck.tt.n_params,
            ck.n_shards, zs_now_s() - prog.start);
    int rc = 1;
    prog.last = zs_now_s(); /* the first line a second into the export, not at its start */
    if (zs_ckpt_export(&ck, out, on_progress, &prog) != ZS_OK) {
        fprintf(stderr, "zshard export: %s\n", zs_last_error());
        goto out_ckpt;
    }
    ZS_INFO("export: wrote %s/model.safetensors and %s/config.json in %.1f s", out, out,
            zs_now_s() - prog.start);
    rc = 0;
out_ckpt:
    zs_ckpt_close(&ck);
    return rc;
}
