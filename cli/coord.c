/*
 * zshard coord: the coordinator.  See server/coord.h.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "server/coord.h"

static const char coord_usage[] =
    "usage: zshard coord --listen tcp://HOST:PORT --config CFG.json --servers S --data PATH\n"
    "                    --steps N --out DIR [--resume CKPT | --resume-if-any DIR]\n"
    "                    [--secret FILE | --insecure] [--metrics HOST:PORT] [--log-level LEVEL]\n"
    "\n"
    "Runs the coordinator: membership, the shard map and the step state of a job; writes\n"
    "DIR/metrics.jsonl, commits the servers' checkpoints (checkpoint.dir, default\n"
    "DIR/checkpoints) and, at the end, exports the final one into DIR/model.safetensors and\n"
    "DIR/config.json.\n"
    "\n"
    "  --listen tcp://HOST:PORT  control endpoint (ZeroMQ) for servers and workers\n"
    "  --config CFG.json         job configuration\n"
    "  --servers S               partition servers to wait for\n"
    "  --data PATH               training data; workers must hold the same data\n"
    "  --steps N                 optimizer steps of the whole run (also when it resumes)\n"
    "  --out DIR                 output directory\n"
    "  --resume CKPT             continue from a checkpoint (a step-* directory), or from the\n"
    "                            newest valid checkpoint of a checkpoint directory, on any\n"
    "                            number of servers; metrics.jsonl keeps its lines up to "
    "it\n"
    "  --resume-if-any DIR       as --resume DIR when DIR holds a checkpoint (a latest file or\n"
    "                            a step-* directory; the newest valid one is taken, and none\n"
    "                            valid is an error), else a fresh start: for a service or a\n"
    "                            batch job that is restarted (deploy/systemd, "
    "deploy/slurm)\n" ZS_CLI_SECRET_USAGE ZS_CLI_METRICS_USAGE
    "  --log-level LEVEL         error, warn, info (default) or debug\n"
    "  -h, --help                this text\n";

int zs_cmd_coord(int argc, char **argv)
{
    static const struct option opts[] = {{"listen", required_argument, NULL, 'l'},
                                         {"config", required_argument, NULL, 'c'},
                                         {"servers", required_argument, NULL, 'S'},
                                         {"data", required_argument, NULL, 'd'},
                                         {"steps", required_argument, NULL, 's'},
                                         {"out", required_argument, NULL, 'o'},
                                         {"resume", required_argument, NULL, 'r'},
                                         {"resume-if-any", required_argument, NULL, 'R'},
                                         {"log-level", required_argument, NULL, 'L'},
                                         {"metrics", required_argument, NULL, 'M'},
                                         {"help", no_argument, NULL, 'h'},
                                         ZS_CLI_SECRET_OPTIONS,
                                         {NULL, 0, NULL, 0}};
    zs_coord_opts o = {.servers = -1, .steps = -1};
    const char *metrics = NULL;
    zs_cli_secret_args sa = {0};
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (zs_cli_secret_opt(c, &sa))
            continue;
        switch (c) {
        case 'l':
            o.listen = optarg;
            break;
        case 'c':
            o.config_path = optarg;
            break;
        case 'd':
            o.data_path = optarg;
            break;
        case 'o':
            o.out_dir = optarg;
            break;
        case 'r':
        case 'R':
            o.resume = optarg;
            o.resume_if_any = c == 'R';
            break;
        case 'M':
            metrics = optarg;
            break;
        case 'S':
            if ((o.servers = (int)zs_cli_int("coord", "--servers", optarg, 1, 4096)) < 0)
                return 2;
            break;
        case 's':
            if ((o.steps = zs_cli_int("coord", "--steps", optarg, 0, 1L << 30)) < 0)
                return 2;
            break;
        case 'L':
            if (zs_cli_log_level("coord", optarg))
                return 2;
            break;
        case 'h':
            fputs(coord_usage, stdout);
            return 0;
        case ':':
            return zs_cli_usage_error("coord", "%s needs a value", argv[optind - 1]);
        default:
            return zs_cli_usage_error("coord", "unknown option \"%s\"", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return zs_cli_usage_error("coord", "unexpected argument \"%s\"", argv[optind]);
    const char *missing = !o.listen        ? "--listen"
                          : !o.config_path ? "--config"
                          : o.servers < 0  ? "--servers"
                          : !o.data_path   ? "--data"
                          : o.steps < 0    ? "--steps"
                          : !o.out_dir     ? "--out"
                                           : NULL;
    if (missing)
        return zs_cli_usage_error("coord", "missing %s", missing);
    zs_secret secret;
    if (zs_cli_secret("coord", sa.path, sa.insecure, &secret))
        return 2;
    o.secret = &secret;
    zs_cli_metrics m;
    if (zs_cli_metrics_start("coord", "coord", metrics, &m)) {
        zs_secret_wipe(&secret);
        return 1;
    }
    o.prom = m.reg;
    zs_cli_catch_signals();
    zs_err e = zs_coord_run(&o, &zs_cli_stop);
    zs_cli_metrics_stop(&m);
    zs_secret_wipe(&secret);
    if (e != ZS_OK) {
        fprintf(stderr, "zshard coord: %s\n", zs_last_error());
        return 1;
    }
    return 0;
}
