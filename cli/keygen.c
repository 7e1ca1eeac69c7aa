/*
 * zshard keygen: writes a new job secret (common/secret.h).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/secret.h"

static const char keygen_usage[] =
    "usage: zshard keygen FILE\n"
    "\n"
    "Writes a new job secret to FILE (32 random bytes as hex, mode 0600; an existing FILE is\n"
    "never overwritten).  Every process of a job proves it holds the secret: give the same\n"
    "file to each with --secret FILE (or ZSHARD_SECRET_FILE=FILE).  Copy it to other hosts\n"
    "the way you copy an SSH key; whoever reads it can join the job.  docs/security.md says\n"
    "what it protects.\n"
    "\n"
    "  -h, --help  this text\n";

int zs_cmd_keygen(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        fputs(keygen_usage, stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-')
        return zs_cli_usage_error("keygen",
                                  argc < 2   ? "missing FILE"
                                  : argc > 2 ? "one FILE only"
                                             : "unknown option \"%s\"",
                                  argv[argc > 1 ? 1 : 0]);
    if (zs_secret_generate(argv[1]) != ZS_OK) {
        fprintf(stderr, "zshard keygen: %s\n", zs_last_error());
        return 1;
    }
    fprintf(stderr, "zshard keygen: wrote %s (mode 0600)\n", argv[1]);
    return 0;
}
