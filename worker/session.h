/*
 * session: a worker's membership in a job, over the control plane.  zs_session_open registers
 * with the coordinator, receives the job spec and the shard map, loads the training data
 * (the job's path, or a local copy), reports its fingerprint, and opens the data-plane client
 * to every server.  Then the worker asks for assignments, computes their chunks through the
 * client, and reports each chunk done; the session keeps the heartbeats going whenever it is
 * called (zs_session_heartbeat is cheap; call it at least once per heartbeat interval, also
 * from inside long computations).
 *
 * Invariant: zs_session_next hands out each (step, chunk) at most once, even when the
 * coordinator repeats or extends an assignment.  Not thread-safe.
 */
#ifndef ZS_SESSION_H
#define ZS_SESSION_H

#include <stdint.h>

#include "common/config.h"
#include "common/data.h"
#include "common/err.h"
#include "common/secret.h"
#include "common/tensors.h"
#include "proto/messages.h"
#include "transport/client.h"

#define ZS_SESSION_MAX_CHUNKS 1024

typedef struct zs_session zs_session;

typedef struct {
    long step;
    double lr;
    double loss_scale;                 /* fp16 jobs: the gradient's multiplier (StepAssign); 1 */
    int n;                             /* chunks to compute */
    int chunks[ZS_SESSION_MAX_CHUNKS]; /* ascending */
} zs_assignment;

/* Registers and sets up (blocks up to timeout_ms for the coordinator's answers).  secret:
 * the job's (or insecure), for the control plane and the data plane; it must outlive the
 * session.  data: a
 * local copy of the job's data, or NULL for the job's path.  A refusal of the registration
 * (another protocol version, a full job) fails here; one that follows the data check (another
 * fingerprint, too many workers) is the error of the first zs_session_next, with the
 * coordinator's reason.  stop (may be NULL): a flag a signal handler sets; once set, the wait
 * ends with ZS_ERR_IO "stopped while registering". */
zs_err zs_session_open(const char *coord, const zs_secret *secret, const char *data, int timeout_ms,
                       volatile int *stop, zs_session **out);
/* What the worker's leaving notice will say: why it fails ("out of memory for ..."), so that
 * the coordinator's log and `zshard status` show it. */
void zs_session_fail(zs_session *s, const char *why);
/* Leaves: tells the coordinator (unless the job ended) and closes everything. */
void zs_session_close(zs_session *s);

uint32_t zs_session_id(const zs_session *s);
/* 1 once the coordinator told this worker to register again (the job's servers changed): the
 * session is over, and a new one joins the job with the new shard map. */
int zs_session_rejoin(const zs_session *s);
const zs_config *zs_session_config(const zs_session *s);
const zs_tensor_table *zs_session_tensors(const zs_session *s);
const zs_dataset *zs_session_data(const zs_session *s);
zs_client *zs_session_client(zs_session *s);
/* Opens another data-plane client to the job's servers with conns streams per server (0:
 * the transport's default), pushing as this worker; the caller closes it, before the
 * session. */
zs_err zs_session_open_client(zs_session *s, int conns, zs_client **out);

/* Waits up to timeout_ms for chunks to compute: *got = 1 and *a filled, or *got = 0 on
 * timeout.  *ended is set when the coordinator said the job is over: then ZS_OK if it
 * finished, the reason if it was aborted or this worker refused. */
zs_err zs_session_next(zs_session *s, int timeout_ms, zs_assignment *a, int *got, int *ended);

/* Reports a chunk computed and pushed: its mean loss, and where the time went (NULL: not
 * measured). */
zs_err zs_session_chunk_done(zs_session *s, long step, int chunk, double loss,
                             const zs_msg_chunk_times *times);

/* Sends a heartbeat if the configured interval has passed since the last one. */
void zs_session_heartbeat(zs_session *s);

#endif
