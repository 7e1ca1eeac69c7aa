# multihost_netem.sh BUILD_DIR WORKDIR (in the guest of tests/rdma/run.sh, whose kernel has
# sch_netem): of tests/integration/multihost_bits.sh, only its run over links with 50 us of
# delay and 1% loss (ZS_MULTIHOST_NETEM=only), which the CI host's kernel cannot shape; the
# host runs the others.  tests/run.sh runs it as a stage of its own, as root:
#   tests/rdma/run.sh build -- bash tests/rdma/multihost_netem.sh build /tmp/mh-netem
# Not a *.test.sh, so guest.sh's suite does not run it: under TCG on a 2-core machine it took
# 25 s in the guest on a quiet machine and 60-85 s on a loaded one (namespaces and tc are slow
# there), and the suite already comes near run.sh's 300 s limit on a loaded machine.
set -euo pipefail
build=$1
work=$2
ZS_MULTIHOST_NETEM=only bash "$(dirname "$0")/../integration/multihost_bits.sh" "$build/zshard" "$work"
