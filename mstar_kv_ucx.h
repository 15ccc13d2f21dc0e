/* mstar_kv_ucx.h - v0.2.0 - moving a request of mstar_kv.h between processes
   and machines over UCX, in one C99 header.

   A request (its blob: token counts, prefix, released window, retention,
   key, and every page's bytes) goes from a sender's arena to a receiver's in
   two phases: the receiver admits every page it needs (all or nothing),
   takes the bytes straight into its pools (runs of one pool's adjacent
   pages, up to message_bytes a message), verifies each message's XXH64 as
   it lands (the sender hashes each as it posts it, so no pass over the
   blob stands between the request and the wire) and acknowledges; only then does the sender remove its copy (or keep it: a
   copy, not a move). A failure at any point, on either side, loses nothing:
   the receiver keeps nothing half-imported and the sender keeps its request
   intact and usable. UCX (the Unified Communication X library: TCP, shared
   memory, RDMA) is loaded at run time, so this header needs no UCX header
   and no UCX library to build; without libucp.so.0 every call that needs it
   returns MSKV_ERROR_UNSUPPORTED with the reason.

   Do this in exactly one C or C++ file, after mstar_kv.h's implementation:
       #define MSTAR_KV_IMPLEMENTATION
       #include "mstar_kv.h"
       #define MSTAR_KV_UCX_IMPLEMENTATION
       #include "mstar_kv_ucx.h"
   Build: cc -std=c99 -O2 app.c -ldl -lpthread -lm
   Its functions carry mstar_kv.h's MSKV_API (MSKV_STATIC, MSKV_DLL for a
   shared library or Windows DLL, or your own MSKV_API: see mstar_kv.h).
   Run time: libucp.so.0 (Debian: apt-get install libucx0). UCX's own
   variables choose the transports, e.g. UCX_TLS=tcp or UCX_TLS=shm,tcp.

   UCX versions: the types below mirror UCP API 1.13 (Debian 12's 1.13.1),
   and every call uses only fields that UCX has had since 1.12 and that
   later releases keep at the same offsets (each struct is selected field
   by field through its field_mask); mskv_ucx_* refuses a libucp older than
   1.12. tests/test_ucx_abi.c checks every mirrored offset and constant
   against the real headers (libucx-dev) when they are installed.

   Example (the two sides run in two processes):
       mskv_ucx *u;                                       receiver
       mskv_ucx_listen(NULL, "127.0.0.1", 13337, &u);
       mskv_ucx_accept(u);
       mskv_ucx_recv(u, arena, &req);                     a resident request
       mskv_ucx_destroy(u);

       mskv_ucx *u;                                       sender
       mskv_ucx_connect(NULL, "127.0.0.1", 13337, &u);
       mskv_ucx_send(u, arena, req, 0);                   removed once acknowledged
       mskv_ucx_destroy(u);

   Pages: an arena with host pools is sent straight from its pools and
   received straight into them (UCX gathers and scatters the pages itself;
   no host copy of the blob). An arena whose pages live behind store_ops (the
   GPU store of mstar_kv_cuda.h) is staged through one host copy of the blob
   (mskv_request_export / mskv_request_import + reload) on its side only;
   UCX's CUDA transports are not used. The two sides need not agree on this.

   Thread safety: an mskv_ucx object belongs to one thread at a time (its
   UCX worker runs in UCS_THREAD_MODE_SINGLE). Distinct objects may be used
   from distinct threads. The arena calls it makes are ordinary arena calls.
   Timeouts: every wait for the peer ends after timeout_ms without progress
   (MSKV_ERROR_TIMEOUT), so nothing waits forever.

   Endpoints: the connection's endpoint (listen/accept, connect, or the
   worker-address rendezvous) uses UCP_ERR_HANDLING_MODE_PEER, so a peer that
   dies or drops the connection fails it (PEER) instead of hanging it; every
   control message (challenge, offer, answer, PREPARED, COMMIT, ACK) goes on
   it. UCX 1.13 refuses its shared-memory transports (posix, sysv, cma) to
   such an endpoint, so on one host the pages go on a second, data endpoint
   to the peer's worker made with UCP_ERR_HANDLING_MODE_NONE, which they
   accept: with UCX_TLS=shm,tcp (or sm,tcp) the pages move through shared
   memory and the control messages over TCP. Each side sends its worker
   address over the connection when it is made, tagged with its host (the
   kernel's boot id) and left out when it has no shared-memory transport;
   the sender makes the data endpoint at its first page and keeps it only
   when UCX gave it a shared-memory lane. Otherwise (UCX_TLS=tcp, another
   host) everything stays on the one endpoint: a MODE_NONE endpoint over TCP
   would only lose the failure detection. A transfer's liveness is the
   connection endpoint's failure and the timeouts; on a failure the
   connection endpoint is closed at once and the data endpoint flushed for
   200 ms at most (UCX refuses a forced close of a MODE_NONE endpoint).
   Should sends stay queued on it (a stopped or dead peer's full FIFO),
   mskv_ucx_destroy leaves the worker and the object allocated, with a
   warning to the logger, because UCX 1.13 aborts the process destroying
   such a worker. While pages are in flight on a context with shared memory
   a wait yields the processor instead of sleeping on the worker's event fd
   (which does not reliably wake for shared memory). desc.lanes = 1 keeps
   everything on the one endpoint (and so on TCP, whatever UCX_TLS says).
   mskv_ucx_lanes says which UCX transports each endpoint really uses.

   License: MIT, as mstar_kv.h.
*/
#ifndef MSTAR_KV_UCX_H
#define MSTAR_KV_UCX_H

#include "mstar_kv.h"
#include <stdio.h>   /* FILE: ucp_ep_print_info's stream */

#ifdef __cplusplus
extern "C" {
#endif

/* // >>ucp types -------------------------------------------------------------
   The UCP and UCS types, constants and functions this layer uses, declared
   here so that no UCX header is needed. Handles are opaque pointers, as in
   ucp_def.h; structs mirror UCP API 1.13 field for field. */

typedef struct mskv_ucp_context_st *mskv_ucp_context;   /* ucp_context_h */
typedef struct mskv_ucp_config_st mskv_ucp_config;      /* ucp_config_t */
typedef struct mskv_ucp_worker_st *mskv_ucp_worker;     /* ucp_worker_h */
typedef struct mskv_ucp_listener_st *mskv_ucp_listener; /* ucp_listener_h */
typedef struct mskv_ucp_ep_st *mskv_ucp_ep;             /* ucp_ep_h */
typedef struct mskv_ucp_conn_request_st *mskv_ucp_conn_request; /* ucp_conn_request_h */
typedef int8_t mskv_ucs_status;                         /* ucs_status_t: a packed enum, one byte; 0 = UCS_OK */
typedef void *mskv_ucs_status_ptr;                      /* ucs_status_ptr_t */
typedef uint64_t mskv_ucp_tag;                          /* ucp_tag_t */
typedef uint64_t mskv_ucp_datatype;                     /* ucp_datatype_t */

/* UCS status codes and UCP field, feature and flag bits, with the values of UCP API 1.13. */
#define MSKV_UCS_OK 0
#define MSKV_UCS_INPROGRESS 1
#define MSKV_UCS_ERR_CANCELED (-16)
#define MSKV_UCS_ERR_LAST (-100)
#define MSKV_UCS_THREAD_MODE_SINGLE 0
#define MSKV_UCP_PARAM_FIELD_FEATURES (1ull << 0)
#define MSKV_UCP_FEATURE_TAG (1ull << 0)
#define MSKV_UCP_FEATURE_WAKEUP (1ull << 4)
#define MSKV_UCS_ERR_BUSY (-15)
#define MSKV_UCP_WORKER_PARAM_FIELD_THREAD_MODE (1ull << 0)
#define MSKV_UCP_LISTENER_PARAM_FIELD_SOCK_ADDR (1ull << 0)
#define MSKV_UCP_LISTENER_PARAM_FIELD_CONN_HANDLER (1ull << 2)
#define MSKV_UCP_LISTENER_ATTR_FIELD_SOCKADDR (1ull << 0)
#define MSKV_UCP_EP_PARAM_FIELD_REMOTE_ADDRESS (1ull << 0)
#define MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE (1ull << 1)
#define MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLER (1ull << 2)
#define MSKV_UCP_EP_PARAM_FIELD_SOCK_ADDR (1ull << 4)
#define MSKV_UCP_EP_PARAM_FIELD_FLAGS (1ull << 5)
#define MSKV_UCP_EP_PARAM_FIELD_CONN_REQUEST (1ull << 6)
#define MSKV_UCP_EP_PARAMS_FLAGS_CLIENT_SERVER 1u
#define MSKV_UCP_ERR_HANDLING_MODE_NONE 0
#define MSKV_UCP_ERR_HANDLING_MODE_PEER 1
#define MSKV_UCP_EP_CLOSE_FLAG_FORCE 1u
#define MSKV_UCP_OP_ATTR_FIELD_CALLBACK (1u << 1)
#define MSKV_UCP_OP_ATTR_FIELD_USER_DATA (1u << 2)
#define MSKV_UCP_OP_ATTR_FIELD_DATATYPE (1u << 3)
#define MSKV_UCP_OP_ATTR_FIELD_FLAGS (1u << 4)
#define MSKV_UCP_OP_ATTR_FIELD_RECV_INFO (1u << 7)
#define MSKV_UCP_OP_ATTR_FLAG_NO_IMM_CMPL (1u << 16)
#define MSKV_UCP_DATATYPE_CONTIG_BYTE ((mskv_ucp_datatype)1 << 3)   /* ucp_dt_make_contig(1) */
#define MSKV_UCP_DATATYPE_IOV ((mskv_ucp_datatype)2)                /* ucp_dt_make_iov() */

typedef struct mskv_ucs_sock_addr { const void *addr; unsigned int addrlen; } mskv_ucs_sock_addr;  /* struct sockaddr *, socklen_t */
typedef struct mskv_ucp_dt_iov { void *buffer; size_t length; } mskv_ucp_dt_iov;   /* ucp_dt_iov_t */
typedef struct mskv_ucp_tag_recv_info { mskv_ucp_tag sender_tag; size_t length; } mskv_ucp_tag_recv_info;   /* ucp_tag_recv_info_t */
typedef void (*mskv_ucp_send_cb)(void *request, mskv_ucs_status status, void *user_data);   /* ucp_send_nbx_callback_t */
typedef void (*mskv_ucp_recv_cb)(void *request, mskv_ucs_status status, const mskv_ucp_tag_recv_info *info, void *user_data);   /* ucp_tag_recv_nbx_callback_t */
typedef void (*mskv_ucp_err_cb)(void *arg, mskv_ucp_ep ep, mskv_ucs_status status);   /* ucp_err_handler_cb_t */
typedef void (*mskv_ucp_conn_cb)(mskv_ucp_conn_request request, void *arg);   /* ucp_listener_conn_callback_t */

/* ucp_params_t */
typedef struct mskv_ucp_params {
    uint64_t field_mask, features;
    size_t request_size;
    void (*request_init)(void *request);
    void (*request_cleanup)(void *request);
    uint64_t tag_sender_mask;
    int mt_workers_shared;
    size_t estimated_num_eps, estimated_num_ppn;
    const char *name;
} mskv_ucp_params;

/* ucp_worker_params_t */
typedef struct mskv_ucp_worker_params {
    uint64_t field_mask;
    int thread_mode;
    struct { unsigned long bits[1024 / (8 * sizeof(unsigned long))]; } cpu_mask;   /* ucs_cpu_set_t */
    unsigned events;
    void *user_data;
    int event_fd;
    uint64_t flags;
    const char *name;
    size_t am_alignment;
    uint64_t client_id;
} mskv_ucp_worker_params;

/* ucp_listener_params_t */
typedef struct mskv_ucp_listener_params {
    uint64_t field_mask;
    mskv_ucs_sock_addr sockaddr;
    struct { void (*cb)(mskv_ucp_ep ep, void *arg); void *arg; } accept_handler;
    struct { mskv_ucp_conn_cb cb; void *arg; } conn_handler;
} mskv_ucp_listener_params;

/* ucp_listener_attr_t */
typedef struct mskv_ucp_listener_attr {
    uint64_t field_mask;
    union { unsigned char bytes[128]; uint64_t align; } sockaddr;   /* struct sockaddr_storage */
} mskv_ucp_listener_attr;

/* ucp_ep_params_t */
typedef struct mskv_ucp_ep_params {
    uint64_t field_mask;
    const void *address;
    int err_mode;
    struct { mskv_ucp_err_cb cb; void *arg; } err_handler;
    void *user_data;
    unsigned flags;
    mskv_ucs_sock_addr sockaddr;
    mskv_ucp_conn_request conn_request;
    const char *name;
    mskv_ucs_sock_addr local_sockaddr;
} mskv_ucp_ep_params;

/* ucp_request_param_t */
typedef struct mskv_ucp_request_param {
    uint32_t op_attr_mask;
    uint32_t flags;
    void *request;
    union { mskv_ucp_send_cb send; mskv_ucp_recv_cb recv; void *other; } cb;
    mskv_ucp_datatype datatype;
    void *user_data;
    void *reply_buffer;
    int memory_type;
    union { size_t *length; mskv_ucp_tag_recv_info *tag_info; } recv_info;
    void *memh;
} mskv_ucp_request_param;

/* Every UCP/UCS function the layer calls: X(return type, name, parameters).
   ucs_status_string lives in libucs, found through libucp's dependencies. */
#define MSKV_UCX_FUNCTIONS(X)                                                                            \
    X(void, ucp_get_version, (unsigned *major, unsigned *minor, unsigned *release))                     \
    X(mskv_ucs_status, ucp_init_version, (unsigned api_major, unsigned api_minor, const mskv_ucp_params *params, const mskv_ucp_config *config, mskv_ucp_context *out)) \
    X(void, ucp_cleanup, (mskv_ucp_context context))                                                   \
    X(mskv_ucs_status, ucp_worker_create, (mskv_ucp_context context, const mskv_ucp_worker_params *params, mskv_ucp_worker *out)) \
    X(void, ucp_worker_destroy, (mskv_ucp_worker worker))                                              \
    X(mskv_ucs_status, ucp_worker_get_address, (mskv_ucp_worker worker, void **address, size_t *length)) \
    X(void, ucp_worker_release_address, (mskv_ucp_worker worker, void *address))                      \
    X(mskv_ucs_status, ucp_worker_get_efd, (mskv_ucp_worker worker, int *fd))                          \
    X(mskv_ucs_status, ucp_worker_arm, (mskv_ucp_worker worker))                                       \
    X(unsigned, ucp_worker_progress, (mskv_ucp_worker worker))                                         \
    X(mskv_ucs_status, ucp_listener_create, (mskv_ucp_worker worker, const mskv_ucp_listener_params *params, mskv_ucp_listener *out)) \
    X(void, ucp_listener_destroy, (mskv_ucp_listener listener))                                        \
    X(mskv_ucs_status, ucp_listener_query, (mskv_ucp_listener listener, mskv_ucp_listener_attr *attr))  \
    X(mskv_ucs_status, ucp_listener_reject, (mskv_ucp_listener listener, mskv_ucp_conn_request request)) \
    X(mskv_ucs_status, ucp_ep_create, (mskv_ucp_worker worker, const mskv_ucp_ep_params *params, mskv_ucp_ep *out)) \
    X(mskv_ucs_status_ptr, ucp_ep_close_nbx, (mskv_ucp_ep ep, const mskv_ucp_request_param *param))    \
    X(mskv_ucs_status_ptr, ucp_tag_send_nbx, (mskv_ucp_ep ep, const void *buffer, size_t count, mskv_ucp_tag tag, const mskv_ucp_request_param *param)) \
    X(mskv_ucs_status_ptr, ucp_tag_recv_nbx, (mskv_ucp_worker worker, void *buffer, size_t count, mskv_ucp_tag tag, mskv_ucp_tag tag_mask, const mskv_ucp_request_param *param)) \
    X(mskv_ucs_status, ucp_request_check_status, (void *request))                                      \
    X(void, ucp_request_cancel, (mskv_ucp_worker worker, void *request))                               \
    X(void, ucp_request_free, (void *request))                                                         \
    X(void, ucp_ep_print_info, (mskv_ucp_ep ep, FILE *stream))                                         \
    X(void, ucp_context_print_info, (mskv_ucp_context context, FILE *stream))                          \
    X(const char *, ucs_status_string, (mskv_ucs_status status))

/* The function table, one member per MSKV_UCX_FUNCTIONS entry (filled by the loader). */
typedef struct mskv_ucx_functions {
#define MSKV__UCX_MEMBER(ret, name, params) ret (*name) params;
    MSKV_UCX_FUNCTIONS(MSKV__UCX_MEMBER)
#undef MSKV__UCX_MEMBER
} mskv_ucx_functions;

/* // >>migration ------------------------------------------------------------ */

/* One side of a migration connection: UCX context, worker and endpoints (opaque; mskv_ucx_listen, mskv_ucx_connect). */
typedef struct mskv_ucx mskv_ucx;

/* Where a test hook runs: on the sender after message m of the pages was
   handed to UCX, on the receiver after message m landed (data: its first
   range's bytes, which the hook may change); MSKV_UCX_HOOK_POSTING: on the
   sender before page message m is handed to UCX; MSKV_UCX_HOOK_STEP: on
   either side at hand-over step m (an MSKV_UCX_STEP_*; data NULL);
   MSKV_UCX_HOOK_CONTROL: before the control message of kind m (an
   MSKV_UCX_MSG_*) is sent. */
typedef enum mskv_ucx_hook_point {
    MSKV_UCX_HOOK_SENT = 1, MSKV_UCX_HOOK_RECEIVED = 2, MSKV_UCX_HOOK_POSTING = 3, MSKV_UCX_HOOK_STEP = 4, MSKV_UCX_HOOK_CONTROL = 5   /* where a test hook runs, as the comment above says */
} mskv_ucx_hook_point;
/* A hook returning MSKV_UCX_HOOK_DROP closes the connection right there, as
   a dropped link would (the call returns MSKV_ERROR_PEER); at
   MSKV_UCX_HOOK_CONTROL it loses that one message instead (it is not sent,
   the connection stays). MSKV_UCX_HOOK_EMPTY at MSKV_UCX_HOOK_POSTING sends
   the page message with no bytes (a lying sender). 0 goes on. */
#define MSKV_UCX_HOOK_DROP 1
#define MSKV_UCX_HOOK_EMPTY 2

/* The hand-over's control messages (MSKV_UCX_HOOK_CONTROL) and steps
   (MSKV_UCX_HOOK_STEP), in protocol order. */
#define MSKV_UCX_MSG_OFFER 1      /* sender: the blob header and sizes */
#define MSKV_UCX_MSG_ANSWER 2     /* receiver: pages taken (0) or the refusal's code */
#define MSKV_UCX_MSG_PREPARED 4   /* receiver: imported, verified, held frozen (0) or why not */
#define MSKV_UCX_MSG_DIGEST 9     /* sender, after the pages: every message's XXH64 (and their MAC under the secret) */
#define MSKV_UCX_MSG_COMMIT 5     /* sender: the decision; from here the move happens */
#define MSKV_UCX_MSG_ACK 6        /* receiver: the request is usable here */
#define MSKV_UCX_STEP_OFFER_SENT 1
#define MSKV_UCX_STEP_ANSWER_RECEIVED 2
#define MSKV_UCX_STEP_PAGES_SENT 3
#define MSKV_UCX_STEP_PREPARED_RECEIVED 4
#define MSKV_UCX_STEP_COMMIT_SENT 5
#define MSKV_UCX_STEP_ACK_RECEIVED 6
#define MSKV_UCX_STEP_OFFER_RECEIVED 11
#define MSKV_UCX_STEP_ANSWER_SENT 12
#define MSKV_UCX_STEP_PAGES_RECEIVED 13
#define MSKV_UCX_STEP_PREPARED_SENT 14
#define MSKV_UCX_STEP_COMMIT_RECEIVED 15
#define MSKV_UCX_STEP_ACK_SENT 16
/* A test hook, called at point with message (see mskv_ucx_hook_point); returns 0 or an MSKV_UCX_HOOK_* action. */
typedef int (*mskv_ucx_hook_fn)(void *user, mskv_ucx_hook_point point, int64_t message, void *data, size_t bytes);

/* What mskv_ucx_listen and mskv_ucx_connect set up: library, timeout, message size, secret, lanes. */
typedef struct mskv_ucx_desc {
    const char *library;        /* NULL: "libucp.so.0" through the loader's search path */
    int32_t timeout_ms;         /* 0 = 10000: a wait for the peer that makes no progress this long is TIMEOUT */
    size_t message_bytes;       /* 0 = 4 MiB; else 4096 to 256 MiB (INVALID_ARGUMENT outside): page bytes per message
                                   (the sender's choice; whole pages, at least one, at most 1024 a message) */
    mskv_allocator allocator;
    mskv_log_fn log;
    void *log_user;
    mskv_ucx_hook_fn hook;      /* tests: fault injection (NULL: none) */
    void *hook_user;
    const void *secret;         /* NULL: no authentication. Else a shared secret (secret_bytes, 1 to 1024): a receiver
                                   refuses (DENIED) every offer without a valid HMAC-SHA-256 under it, before it takes a page;
                                   a sender signs its offers with it. Copied at listen/connect. */
    size_t secret_bytes;
    int32_t lanes;              /* 0 = 2: pages go on a data endpoint of their own when the peer is on this host and both
                                   have shared memory, every control message on the connection's endpoint (see
                                   "Endpoints" at the top); 1: everything on one endpoint. Else INVALID_ARGUMENT. */
} mskv_ucx_desc;

/* Flags of mskv_ucx_send. */
#define MSKV_UCX_KEEP 1u        /* keep the sender's request after the acknowledgement: a copy, not a move */

/* SHA-256 (FIPS 180-4) of n bytes into out (32 bytes), and HMAC-SHA-256 (RFC 2104)
   of data under key; the offer's MAC. NULL data/key with n = 0 is fine.
   Thread safety: any thread. */
MSKV_API void mskv_sha256(const void *data, size_t n, unsigned char *out);
/* HMAC-SHA-256 of data under key into out (32 bytes). */
MSKV_API void mskv_hmac_sha256(const void *key, size_t key_bytes, const void *data, size_t n, unsigned char *out);

/* Whether UCX can be loaded: SUCCESS, or UNSUPPORTED with the reason in why
   (the loader's message; "UCX is not available on Windows"). library NULL =
   "libucp.so.0". Thread safety: any thread. */
MSKV_API mskv_result mskv_ucx_probe(const char *library, char *why, size_t why_cap);

/* The receiving side: a UCX context and worker listening on ip:port (IPv4
   dotted quad; port 0 = any free port, see mskv_ucx_port).
   Return value: SUCCESS, UNSUPPORTED (no UCX; the reason goes to the
   logger), INVALID_ARGUMENT (not an IPv4 address), PEER (UCX refused the
   address: in use, not local), OUT_OF_MEMORY. Nothing is left on error. */
MSKV_API mskv_result mskv_ucx_listen(const mskv_ucx_desc *desc, const char *ip, uint16_t port, mskv_ucx **out);
/* The port a listener is bound to. BAD_STATE for a connecting object. */
MSKV_API mskv_result mskv_ucx_port(mskv_ucx *u, uint16_t *port);
/* Waits (timeout_ms) for one peer to connect to the listener and makes
   the endpoint to it; later peers are rejected. TIMEOUT, PEER, BAD_STATE
   (already connected, or not a listener). */
MSKV_API mskv_result mskv_ucx_accept(mskv_ucx *u);
/* The rendezvous through worker addresses, with no listening socket of
   UCX's connection manager: UCX 1.13's tcp_sockcm aborts the process (an
   assertion in tcp_sockcm_ep.c) on a TCP connection whose first bytes claim
   a short private-data length, and no UCX setting avoids it, so a port
   scan can kill a receiver made by mskv_ucx_listen. The default for
   untrusted networks: mskv_ucx_listen_address makes a receiver and gives
   its worker address (mskv_ucx_address: bytes valid while u lives), which
   the caller carries to the sender out of band; mskv_ucx_connect_address
   makes the sender's endpoint from it and sends its own worker address;
   mskv_ucx_accept then takes the first such hello and connects back. From
   there everything is as with a listener (set desc.secret: anyone who
   learns the address can still offer). UCX's transports keep their own
   sockets (the tcp transport listens for its connections), which take
   junk without aborting (tests/test_ucx.c sends junk to every listening
   port of a receiver made this way). Return values as mskv_ucx_listen /
   mskv_ucx_connect; INVALID_ARGUMENT for a NULL or empty address or one
   over 64 KiB. */
MSKV_API mskv_result mskv_ucx_listen_address(const mskv_ucx_desc *desc, mskv_ucx **out);
/* The receiver's worker address, for the sender (the bytes stay valid while u lives). */
MSKV_API mskv_result mskv_ucx_address(mskv_ucx *u, const void **address, size_t *bytes);
/* The sender's endpoint from a receiver's worker address (see above). */
MSKV_API mskv_result mskv_ucx_connect_address(const mskv_ucx_desc *desc, const void *address, size_t bytes, mskv_ucx **out);
/* The sending side: a UCX context and worker with an endpoint to ip:port.
   The connection completes with the first message (a peer that is not
   there shows as PEER or TIMEOUT then). */
MSKV_API mskv_result mskv_ucx_connect(const mskv_ucx_desc *desc, const char *ip, uint16_t port, mskv_ucx **out);

/* The hand-over: at no moment do both sides hold a usable copy, and the
   request is never lost.
     sender                          receiver
     OFFER  ---------------------->  takes the pages (all or nothing)
            <----------------------  ANSWER (0, or the refusal)
     pages  ---------------------->  lands them, verifies, holds the request FROZEN
            <----------------------  PREPARED (0, or why not: nothing kept)
     COMMIT ---------------------->  the decision: the request becomes usable here
     (frozen until) <--------------  ACK
     removes its copy
   The sender's request is frozen from the offer on (export_begin: reads
   work, changes are BAD_STATE); before it sends COMMIT, any failure gives
   it back usable. A side whose wait times out (or whose connection fails)
   after the outcome left its hands returns MSKV_ERROR_IN_DOUBT: the sender
   after COMMIT (no ACK), the receiver after PREPARED (no COMMIT). Its copy
   stays frozen, the connection is closed, and nothing else may happen on
   this object until mskv_ucx_resolve says which way it went, decided from
   the other side's result (learned out of band, e.g. by the program that
   runs both):
     the other side returned SUCCESS, or IN_DOUBT too    -> MSKV_UCX_COMMITTED
     the other side returned any other code              -> MSKV_UCX_ABORTED
     the other side's process is gone (its copy with it) -> keep ours:
         a sender MSKV_UCX_ABORTED, a receiver MSKV_UCX_COMMITTED
   (A receiver returns another code only before its PREPARED left, and a
   sender only before its COMMIT did, so these rules never keep two.)
   Pages behind store_ops (staged) cannot be frozen by the arena: there the
   in-doubt copy is frozen by contract only (the sender's caller must not
   use its handle; the receiver's handle is given out only by resolve). */
#define MSKV_UCX_COMMITTED 1      /* the move happened: a sender drops its copy, a receiver keeps its */
#define MSKV_UCX_ABORTED 2        /* it did not: a sender keeps its copy, a receiver drops its */

/* Moves request req of arena to the peer (which calls mskv_ucx_recv): the
   offer (blob header and sizes), the peer's answer, the pages and their
   per-message XXH64 hashes (the DIGEST), the peer's word that it imported and verified them, the commit and the
   peer's acknowledgement; then req is removed (flags MSKV_UCX_KEEP: kept;
   a copy). The request is frozen meanwhile (mskv_request_export_begin).
   IN_DOUBT: see above (req frozen, mskv_ucx_resolve). On any other failure
   the request is as it was and usable, and the code says why:
     PEER       the peer died, closed the connection, or sent nonsense
     TIMEOUT    no progress for timeout_ms
     DENIED     the receiver has a secret and the offer's MAC did not match
                it (no secret here, another one), or the offer was a replay;
                the connection is closed
     OUT_OF_PAGES, BLOB_MISMATCH, DUPLICATE, TOO_MANY_REQUESTS,
     OUT_OF_MEMORY, BLOB_CORRUPT (the pages arrived changed)
                the receiver refused or failed the import with this code
     RESERVATION_PENDING, BAD_STATE (a lockstep member, an open export),
     INVALID_HANDLE: the request cannot be exported
   After PEER or TIMEOUT the connection is closed (later calls: PEER). */
MSKV_API mskv_result mskv_ucx_send(mskv_ucx *u, mskv_arena *arena, mskv_request req, uint32_t flags);
/* Receives one request from the peer into arena: a new resident request
   in *out (a streamed import: every page admitted at once, all or
   nothing). On any failure nothing was imported and the code says why:
   OUT_OF_PAGES and the other import codes (the sender gets the same code),
   DENIED (desc.secret set and the offer's HMAC-SHA-256 missing or wrong,
   or its counter not past the last accepted one: a replay; refused before
   a single page is taken, the connection is closed),
   BLOB_CORRUPT (a message's XXH64 did not match the sender's DIGEST, or
   with a secret the DIGEST's MAC did not match; the log names the
   message), PEER (also a
   page message that is not exactly its offered length), TIMEOUT.
   IN_DOUBT: the request was verified and PREPARED sent, but no COMMIT came:
   it stays frozen (*out holds its handle) until mskv_ucx_resolve.
   TIMEOUT before any offer arrived leaves the connection usable (call
   again to wait longer); after PEER or a later TIMEOUT it is closed. */
MSKV_API mskv_result mskv_ucx_recv(mskv_ucx *u, mskv_arena *arena, mskv_request *out);
/* Ends an IN_DOUBT hand-over the way outcome (MSKV_UCX_COMMITTED or
   MSKV_UCX_ABORTED) says: a sender removes its request (COMMITTED; with
   MSKV_UCX_KEEP it keeps it) or gives it back usable (ABORTED); a receiver
   makes its request usable and returns it in *out (COMMITTED; out may be
   NULL on a sender) or removes it (ABORTED). Return value: SUCCESS,
   NULL_POINTER, INVALID_ARGUMENT (outcome neither; nothing changes),
   BAD_STATE (nothing is in doubt), or the arena call's code. */
MSKV_API mskv_result mskv_ucx_resolve(mskv_ucx *u, int outcome, mskv_request *out);
/* Whether u holds a hand-over in doubt: 0 none, 1 as the sender, 2 as the
   receiver; *req (may be NULL) gets the frozen request's handle. */
MSKV_API int mskv_ucx_in_doubt(const mskv_ucx *u, mskv_request *req);
/* Which UCX transports carry the tag messages (eager, rendezvous: lanes
   marked am, am_bw, rma_bw or tag_offload by ucp_ep_print_info) on each
   endpoint, as one line in buf (cap bytes with the terminating 0), e.g.
   "control tcp/lo; data posix/memory cma/memory" (UCX's transport/device
   names), or "control tcp/lo; data tcp/lo (one endpoint)" with desc.lanes 1.
   Makes the data endpoint if it is not there yet (waiting, timeout_ms at
   most, for the peer's worker address). Call it once connected: before the
   first message the connection's endpoint may still show its connection
   manager only. Return value: SUCCESS, NULL_POINTER, BAD_STATE (not
   connected, or the connection is closed), CAPACITY (cap too small: nothing
   written; the message says how much is needed), IO (no temporary file for
   UCX's report), PEER or TIMEOUT (no address from the peer). */
MSKV_API mskv_result mskv_ucx_lanes(mskv_ucx *u, char *buf, size_t cap);
/* Closes the connection and the listener, frees everything. NULL is a no-op.
   A hand-over still in doubt stays as it is in the arena (frozen). */
MSKV_API void mskv_ucx_destroy(mskv_ucx *u);

#ifdef __cplusplus
}
#endif
#endif /* MSTAR_KV_UCX_H */

/* ======================================================================== */

#ifdef MSTAR_KV_UCX_IMPLEMENTATION
#ifndef MSTAR_KV_UCX_IMPLEMENTATION_DONE
#define MSTAR_KV_UCX_IMPLEMENTATION_DONE

#ifndef MSKV_IMPL
#error "mstar_kv_ucx.h: define MSTAR_KV_IMPLEMENTATION and include mstar_kv.h first, in the same file"
#endif

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef _WIN32
#include <dlfcn.h>
#include <sched.h>
#include <sys/time.h>
#include <poll.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* // >>platform ---------------------------------------------------------------
   What this layer needs from the operating system beyond mstar_kv.h's
   platform section: loading a library, an IPv4 socket address, and a clock
   for timeouts. POSIX only: on Windows the loader says UCX is unavailable
   (UCX has no Windows build), and the rest is never reached. */

#define MSKV__UCX_NO_WINDOWS "UCX is not available on Windows"

static void mskv__ucx_copystr(char *dst, size_t cap, const char *src) {
    size_t n;
    if (!dst || cap == 0) return;
    n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* The library, or NULL and the loader's reason in why. */
static void *mskv__ucx_lib_open(const char *name, char *why, size_t cap) {
#ifdef _WIN32
    (void)name;
    mskv__ucx_copystr(why, cap, MSKV__UCX_NO_WINDOWS);
    return NULL;
#else
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        mskv__ucx_copystr(why, cap, e ? e : "not found");
    }
    return lib;
#endif
}

/* A function's address (dlsym searches the library and its dependencies). */
static void *mskv__ucx_sym(void *lib, const char *name) {
#ifdef _WIN32
    (void)lib;
    (void)name;
    return NULL;
#else
    return dlsym(lib, name);
#endif
}

static void mskv__ucx_lib_close(void *lib) {
#ifndef _WIN32
    if (lib) dlclose(lib);
#else
    (void)lib;
#endif
}

/* Milliseconds on a clock that only the differences of matter. */
static int64_t mskv__ucx_now_ms(void) {
#ifdef _WIN32
    return 0;
#else
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
#endif
}

/* Sleeps until fd is readable or ms pass (the worker's event fd). */
static void mskv__ucx_sleep_on(int fd, int ms) {
#ifndef _WIN32
    struct pollfd p;
    p.fd = fd;
    p.events = POLLIN;
    p.revents = 0;
    (void)poll(&p, 1, ms);
#else
    (void)fd;
    (void)ms;
#endif
}

/* Gives the processor away for a moment: a peer on the same busy cores
   gets to run instead of waiting for this process's time slice to end. */
static void mskv__ucx_yield(void) {
#ifndef _WIN32
    sched_yield();
#endif
}

/* An IPv4 socket address in storage (at least 16 bytes); 0 when ip is not a
   dotted quad. */
static int mskv__ucx_sockaddr(const char *ip, uint16_t port, void *storage, unsigned *len) {
#ifdef _WIN32
    (void)ip; (void)port; (void)storage; (void)len;
    return 0;
#else
    struct sockaddr_in in;
    memset(&in, 0, sizeof in);
    in.sin_family = AF_INET;
    in.sin_port = htons(port);
    if (inet_pton(AF_INET, ip, &in.sin_addr) != 1) return 0;
    memcpy(storage, &in, sizeof in);
    *len = (unsigned)sizeof in;
    return 1;
#endif
}

static uint16_t mskv__ucx_sockaddr_port(const void *storage) {
#ifdef _WIN32
    (void)storage;
    return 0;
#else
    struct sockaddr_in in;
    memcpy(&in, storage, sizeof in);
    return in.sin_family == AF_INET ? ntohs(in.sin_port) : 0;
#endif
}

/* // >>sha256 -------------------------------------------------------------------
   SHA-256 as FIPS 180-4 section 6.2 gives it (big-endian words, 64 rounds),
   and HMAC (RFC 2104): H((K0 ^ opad) || H((K0 ^ ipad) || text)), K0 the key
   padded to the 64-byte block (hashed first when longer). */

typedef struct mskv__sha256 {
    uint32_t h[8];
    unsigned char buf[64];
    size_t fill;
    uint64_t bytes;
} mskv__sha256;

static const uint32_t mskv__sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

#define MSKV__ROTR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void mskv__sha256_block(mskv__sha256 *c, const unsigned char *p) {
    uint32_t w[64], a, b, d, e, f, g, h, cc, t1, t2;
    int t;
    for (t = 0; t < 16; t++) w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | (uint32_t)p[4 * t + 3];
    for (t = 16; t < 64; t++) {
        uint32_t s0 = MSKV__ROTR32(w[t - 15], 7) ^ MSKV__ROTR32(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = MSKV__ROTR32(w[t - 2], 17) ^ MSKV__ROTR32(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = s1 + w[t - 7] + s0 + w[t - 16];
    }
    a = c->h[0]; b = c->h[1]; cc = c->h[2]; d = c->h[3]; e = c->h[4]; f = c->h[5]; g = c->h[6]; h = c->h[7];
    for (t = 0; t < 64; t++) {
        t1 = h + (MSKV__ROTR32(e, 6) ^ MSKV__ROTR32(e, 11) ^ MSKV__ROTR32(e, 25)) + ((e & f) ^ (~e & g)) + mskv__sha256_k[t] + w[t];
        t2 = (MSKV__ROTR32(a, 2) ^ MSKV__ROTR32(a, 13) ^ MSKV__ROTR32(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g; g = f; f = e; e = d + t1; d = cc; cc = b; b = a; a = t1 + t2;
    }
    c->h[0] += a; c->h[1] += b; c->h[2] += cc; c->h[3] += d; c->h[4] += e; c->h[5] += f; c->h[6] += g; c->h[7] += h;
}

static void mskv__sha256_init(mskv__sha256 *c) {
    static const uint32_t h0[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au, 0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    memcpy(c->h, h0, sizeof h0);
    c->fill = 0;
    c->bytes = 0;
}

static void mskv__sha256_update(mskv__sha256 *c, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    c->bytes += n;
    while (n > 0) {
        size_t k = 64 - c->fill < n ? 64 - c->fill : n;
        if (c->fill == 0 && n >= 64) {
            mskv__sha256_block(c, p);
            p += 64;
            n -= 64;
            continue;
        }
        memcpy(c->buf + c->fill, p, k);
        c->fill += k;
        p += k;
        n -= k;
        if (c->fill == 64) {
            mskv__sha256_block(c, c->buf);
            c->fill = 0;
        }
    }
}

static void mskv__sha256_final(mskv__sha256 *c, unsigned char out[32]) {
    uint64_t bits = c->bytes * 8;
    unsigned char pad[72];
    size_t padn = (c->fill < 56 ? 56 : 120) - c->fill;
    int i;
    memset(pad, 0, sizeof pad);
    pad[0] = 0x80;
    for (i = 0; i < 8; i++) pad[padn + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
    mskv__sha256_update(c, pad, padn + 8);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(c->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)c->h[i];
    }
}

MSKV_IMPL void mskv_sha256(const void *data, size_t n, unsigned char *out) {
    mskv__sha256 c;
    mskv__sha256_init(&c);
    if (n) mskv__sha256_update(&c, data, n);
    mskv__sha256_final(&c, out);
}

/* K0 of a key: the key padded with zeros to 64 bytes, or its hash when longer. */
static void mskv__hmac_k0(const void *key, size_t kn, unsigned char k0[64]) {
    memset(k0, 0, 64);
    if (kn > 64) mskv_sha256(key, kn, k0);
    else if (kn) memcpy(k0, key, kn);
}

/* HMAC over the concatenation of up to three pieces, from K0. */
static void mskv__hmac3(const unsigned char k0[64], const void *a, size_t an, const void *b, size_t bn, const void *c3, size_t cn, unsigned char out[32]) {
    unsigned char pad[64], inner[32];
    mskv__sha256 c;
    int i;
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k0[i] ^ 0x36);
    mskv__sha256_init(&c);
    mskv__sha256_update(&c, pad, 64);
    if (an) mskv__sha256_update(&c, a, an);
    if (bn) mskv__sha256_update(&c, b, bn);
    if (cn) mskv__sha256_update(&c, c3, cn);
    mskv__sha256_final(&c, inner);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k0[i] ^ 0x5c);
    mskv__sha256_init(&c);
    mskv__sha256_update(&c, pad, 64);
    mskv__sha256_update(&c, inner, 32);
    mskv__sha256_final(&c, out);
}

MSKV_IMPL void mskv_hmac_sha256(const void *key, size_t key_bytes, const void *data, size_t n, unsigned char *out) {
    unsigned char k0[64];
    mskv__hmac_k0(key, key_bytes, k0);
    mskv__hmac3(k0, data, n, NULL, 0, NULL, 0, out);
}

/* Compares two MACs in time that does not depend on where they differ. */
static int mskv__mac_equal(const unsigned char *a, const unsigned char *b) {
    unsigned d = 0;
    int i;
    for (i = 0; i < 32; i++) d |= (unsigned)(a[i] ^ b[i]);
    return d == 0;
}

/* 16 unpredictable bytes (the receiver's challenge): /dev/urandom, else the clock and addresses mixed by SHA-256. */
static void mskv__ucx_random(unsigned char out[16]) {
    unsigned char h[32];
    struct { int64_t t; const void *p; const void *q; unsigned char b[16]; } seed;
    FILE *f = fopen("/dev/urandom", "rb");
    memset(&seed, 0, sizeof seed);
    if (f) {
        size_t got = fread(seed.b, 1, sizeof seed.b, f);
        fclose(f);
        if (got == sizeof seed.b) { memcpy(out, seed.b, 16); return; }
    }
    seed.t = mskv__ucx_now_ms();
    seed.p = (const void *)&seed;
    seed.q = (const void *)out;
    mskv_sha256(&seed, sizeof seed, h);
    memcpy(out, h, 16);
}

/* // >>loader -------------------------------------------------------------------
   Each object opens the library for itself (the loader counts references),
   so there is no global state at all. */

#define MSKV__UCX_DEFAULT_LIB "libucp.so.0"

static mskv_result mskv__ucx_load(const char *library, void **lib_out, mskv_ucx_functions *fn, char *why, size_t cap) {
    const char *name = library ? library : MSKV__UCX_DEFAULT_LIB;
    char err[400] = "";
    void *lib = mskv__ucx_lib_open(name, err, sizeof err), *p;
    unsigned major = 0, minor = 0, release = 0;
    memset(fn, 0, sizeof *fn);
    if (!lib) {
        snprintf(why, cap, "%s: %s (no UCX: Debian's libucx0)", name, err);
        return MSKV_ERROR_UNSUPPORTED;
    }
#define MSKV__UCX_RESOLVE(ret, fname, params)                                                   \
    p = mskv__ucx_sym(lib, #fname);                                                            \
    if (!p) {                                                                                  \
        snprintf(why, cap, "%s: no symbol %s (not a UCP library, or too old)", name, #fname); \
        mskv__ucx_lib_close(lib);                                                             \
        return MSKV_ERROR_UNSUPPORTED;                                                        \
    }                                                                                          \
    memcpy((void *)&fn->fname, &p, sizeof p);
    MSKV_UCX_FUNCTIONS(MSKV__UCX_RESOLVE)
#undef MSKV__UCX_RESOLVE
    fn->ucp_get_version(&major, &minor, &release);
    if (major != 1 || minor < 12) {
        snprintf(why, cap, "%s: UCX %u.%u.%u; this layer needs 1.12 or newer (1.x)", name, major, minor, release);
        mskv__ucx_lib_close(lib);
        return MSKV_ERROR_UNSUPPORTED;
    }
    *lib_out = lib;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_ucx_probe(const char *library, char *why, size_t why_cap) {
    mskv_ucx_functions fn;
    void *lib = NULL;
    char tmp[512] = "";
    mskv_result r = mskv__ucx_load(library, &lib, &fn, tmp, sizeof tmp);
    if (r == MSKV_SUCCESS) {
        unsigned major = 0, minor = 0, release = 0;
        fn.ucp_get_version(&major, &minor, &release);
        snprintf(tmp, sizeof tmp, "UCX %u.%u.%u", major, minor, release);
        mskv__ucx_lib_close(lib);
    }
    mskv__ucx_copystr(why, why_cap, tmp);
    return r;
}

/* The protocol's constants (described in its section below) and byte order. */
#define MSKV__UCX_MAGIC 0x55564B4Du     /* "MKVU" */
#define MSKV__UCX_PROTOCOL 4u   /* 4: messages run along one pool, per-message XXH64 in a DIGEST */
#define MSKV__UCX_OFFER_FIXED 128u
#define MSKV__UCX_OFFER_MAX (MSKV__UCX_OFFER_FIXED + MSKV_BLOB_HEADER_MAX)
#define MSKV__UCX_TAG(kind, n) ((mskv_ucp_tag)(kind) << 56 | ((mskv_ucp_tag)(n) & 0x00FFFFFFFFFFFFFFull))
enum { MSKV__UCX_OFFER = MSKV_UCX_MSG_OFFER, MSKV__UCX_ANSWER = MSKV_UCX_MSG_ANSWER, MSKV__UCX_DATA = 3,
       MSKV__UCX_DONE = MSKV_UCX_MSG_PREPARED, MSKV__UCX_COMMIT = MSKV_UCX_MSG_COMMIT, MSKV__UCX_ACK = MSKV_UCX_MSG_ACK,
       MSKV__UCX_CHALLENGE = 7, MSKV__UCX_HELLO = 8, MSKV__UCX_DIGEST = MSKV_UCX_MSG_DIGEST, MSKV__UCX_ADDRESS = 10 };
#define MSKV__UCX_HELLO_MAX 65536u   /* a hello: magic, version, the sender's worker address */
/* ADDRESS (either side, once, on the connection's endpoint after it is made
   through UCX's connection manager): magic, version, the sender's worker
   address, for the peer's data endpoint. Up to MSKV__UCX_HELLO_MAX bytes. */

static void mskv__ucx_put32(unsigned char *p, uint32_t v) { int i; for (i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void mskv__ucx_put64(unsigned char *p, uint64_t v) { int i; for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t mskv__ucx_get32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t mskv__ucx_get64(const unsigned char *p) { return (uint64_t)mskv__ucx_get32(p) | (uint64_t)mskv__ucx_get32(p + 4) << 32; }

/* // >>endpoint -----------------------------------------------------------------
   One context, one worker, at most one listener, the connection's endpoint
   and the data endpoint per object (see "Endpoints" at the top).
   Operations complete by polling the worker; a window of messages is in
   flight at a time. */

#define MSKV__UCX_WINDOW 16             /* page messages in flight */
#define MSKV__UCX_MAX_RANGES 1024      /* ranges per message (its gather list) */
#define MSKV__UCX_MESSAGE_MIN ((size_t)4096)       /* mskv_ucx_desc.message_bytes' range */
#define MSKV__UCX_MESSAGE_MAX ((size_t)256 << 20)

typedef struct mskv__ucx_op {
    void *req;                  /* UCX's request while in flight */
    int busy, done;
    mskv_ucs_status status;
    mskv_ucp_tag_recv_info info;
    mskv_ucp_dt_iov *iov;       /* the message's gather/scatter list */
    int niov;                   /* its entries */
    int64_t message;
    mskv_result why;            /* failed before UCX had it (no data endpoint): the code to return */
} mskv__ucx_op;

struct mskv_ucx {
    mskv_ucx_desc desc;
    mskv_allocator al;
    void *lib;
    mskv_ucx_functions fn;
    mskv_ucp_context ctx;
    mskv_ucp_worker worker;
    mskv_ucp_listener listener;
    mskv_ucp_ep ep;
    mskv_ucp_conn_request pending;     /* a connection request not yet accepted */
    int is_listener;
    int by_address;                    /* a rendezvous through worker addresses (no listener) */
    void *my_addr;                     /* this worker's address (ucp_worker_get_address), or NULL */
    size_t my_addr_len;
    unsigned char *hello;              /* receiver: the peer's worker address arrives here */
    mskv_ucs_status failed;            /* the endpoint's error (err handler), 0 while healthy */
    int efd;                           /* the worker's event fd (UCP_FEATURE_WAKEUP), -1 without */
    int broken;                        /* the connection is gone: every later call is PEER */
    mskv__ucx_op ops[MSKV__UCX_WINDOW + 3];   /* the page window, the control messages' two, the challenge's */
    mskv_ucp_dt_iov *iov_mem;          /* MSKV__UCX_WINDOW lists of MSKV__UCX_MAX_RANGES */
    unsigned char addr[128];
    unsigned addrlen;
    int doubt;                         /* a hand-over in doubt: 0 none, 1 sender, 2 receiver */
    mskv_arena *doubt_arena;
    mskv_request doubt_req;
    uint32_t doubt_flags;              /* the sender's mskv_ucx_send flags */
    int doubt_frozen;                  /* the request's export is open (host pools) */
    int authed;                        /* a secret was given: k0 is its HMAC key block */
    unsigned char k0[64];
    unsigned char challenge[24];
    int challenge_sent;       /* the receiver's: magic, version, 16 random bytes, fresh per connection */
    int have_challenge;
    uint64_t offers_sent, last_counter;   /* the offers' counter: each must exceed the last one accepted */
    int lanes;                         /* 2: a data endpoint for the pages, 1: everything on ep */
    mskv_ucp_ep data_ep;               /* the pages' endpoint (ERR_HANDLING_MODE_NONE), made at the first page sent */
    unsigned char *peer_addr;          /* the peer's worker address (its ADDRESS message, or the rendezvous), or NULL */
    size_t peer_addr_len;
    int have_peer_addr;
    int data_lane;                     /* where the pages go: 0 not decided yet, 1 on ep (no shared memory to the peer), 2 on data_ep */
    int stuck;                         /* the data endpoint did not drain when the connection broke: the worker cannot be destroyed */
    int ctx_shm;                       /* this context has a shared-memory transport (UCX_TLS allows one) */
    unsigned char *addr_msg;           /* our ADDRESS message while it is sent */
    mskv__ucx_op addr_ops[2];          /* our ADDRESS's send, the peer's ADDRESS's receive: not in ops (no transfer waits on them) */
};

static mskv_result mskv__ucx_err(mskv_ucx *u, mskv_result code, const char *fmt, ...) {
    if (u && u->desc.log) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        u->desc.log(u->desc.log_user, MSKV_LOG_ERROR, msg);
    }
    return code;
}

static const char *mskv__ucx_status(mskv_ucx *u, mskv_ucs_status s) {
    const char *t = u->fn.ucs_status_string ? u->fn.ucs_status_string(s) : NULL;
    return t ? t : "unknown UCS status";
}

static void mskv__ucx_on_error(void *arg, mskv_ucp_ep ep, mskv_ucs_status status) {
    mskv_ucx *u = (mskv_ucx *)arg;
    (void)ep;
    if (!u->failed) u->failed = status ? status : -1;
}

static void mskv__ucx_on_conn(mskv_ucp_conn_request request, void *arg) {
    mskv_ucx *u = (mskv_ucx *)arg;
    if (!u->pending && !u->ep) u->pending = request;
    else u->fn.ucp_listener_reject(u->listener, request);   /* one peer per object */
}

static void mskv__ucx_on_send(void *request, mskv_ucs_status status, void *user) {
    mskv__ucx_op *op = (mskv__ucx_op *)user;
    (void)request;
    op->status = status;
    op->done = 1;
}

static void mskv__ucx_on_recv(void *request, mskv_ucs_status status, const mskv_ucp_tag_recv_info *info, void *user) {
    mskv__ucx_op *op = (mskv__ucx_op *)user;
    (void)request;
    op->status = status;
    if (info) op->info = *info;
    op->done = 1;
}

/* The object and its worker; nothing is left on error. */
static mskv_result mskv__ucx_create(const mskv_ucx_desc *desc, mskv_ucx **out) {
    mskv_ucx_desc d;
    mskv_ucx *u;
    mskv_ucp_params cp;
    mskv_ucp_worker_params wp;
    mskv_ucs_status s;
    mskv_allocator al;
    char why[512];
    mskv_result r;
    int i;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (d.secret && (d.secret_bytes < 1 || d.secret_bytes > 1024)) {
        if (d.log) {
            char msg[160];
            snprintf(msg, sizeof msg, "ucx: secret_bytes %zu is not within 1 to 1024", d.secret_bytes);
            d.log(d.log_user, MSKV_LOG_ERROR, msg);
        }
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if (d.lanes < 0 || d.lanes > 2) {
        if (d.log) {
            char msg[160];
            snprintf(msg, sizeof msg, "ucx: lanes %d is none of 0 (= 2), 1 (one endpoint) and 2 (a data endpoint for the pages)", (int)d.lanes);
            d.log(d.log_user, MSKV_LOG_ERROR, msg);
        }
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if (d.message_bytes != 0 && (d.message_bytes < MSKV__UCX_MESSAGE_MIN || d.message_bytes > MSKV__UCX_MESSAGE_MAX)) {
        if (d.log) {
            char msg[160];
            snprintf(msg, sizeof msg, "ucx: message_bytes %zu is not within %zu to %zu (or 0: 4 MiB)", d.message_bytes,
                     (size_t)MSKV__UCX_MESSAGE_MIN, (size_t)MSKV__UCX_MESSAGE_MAX);
            d.log(d.log_user, MSKV_LOG_ERROR, msg);
        }
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if (d.lanes == 0) d.lanes = 2;
    if (d.timeout_ms <= 0) d.timeout_ms = 10000;
    if (d.message_bytes == 0) d.message_bytes = (size_t)4 << 20;
    al = d.allocator;
    u = (mskv_ucx *)mskv__alloc(&al, sizeof *u);
    if (!u) return MSKV_ERROR_OUT_OF_MEMORY;
    memset(u, 0, sizeof *u);
    if (d.secret) {
        mskv__hmac_k0(d.secret, d.secret_bytes, u->k0);
        u->authed = 1;
    }
    d.secret = NULL;   /* only its key block is kept */
    d.secret_bytes = 0;
    u->desc = d;
    u->al = al;
    u->lanes = (int)d.lanes;
    r = mskv__ucx_load(d.library, &u->lib, &u->fn, why, sizeof why);
    if (r != MSKV_SUCCESS) {
        mskv__ucx_err(u, r, "ucx: %s", why);
        mskv__free(&al, u);
        return r;
    }
    u->iov_mem = (mskv_ucp_dt_iov *)mskv__alloc(&al, sizeof(mskv_ucp_dt_iov) * MSKV__UCX_WINDOW * MSKV__UCX_MAX_RANGES);
    if (!u->iov_mem) { mskv__ucx_lib_close(u->lib); mskv__free(&al, u); return MSKV_ERROR_OUT_OF_MEMORY; }
    for (i = 0; i < MSKV__UCX_WINDOW; i++) u->ops[i].iov = u->iov_mem + (size_t)i * MSKV__UCX_MAX_RANGES;
    memset(&cp, 0, sizeof cp);
    cp.field_mask = MSKV_UCP_PARAM_FIELD_FEATURES;
    cp.features = MSKV_UCP_FEATURE_TAG | MSKV_UCP_FEATURE_WAKEUP;   /* waits sleep on the event fd */
    u->efd = -1;
    s = u->fn.ucp_init_version(1, 12, &cp, NULL, &u->ctx);
    if (s != MSKV_UCS_OK) {
        cp.features = MSKV_UCP_FEATURE_TAG;   /* no transport with events: spin and yield as before */
        s = u->fn.ucp_init_version(1, 12, &cp, NULL, &u->ctx);
    }
    if (s == MSKV_UCS_OK) {
        memset(&wp, 0, sizeof wp);
        wp.field_mask = MSKV_UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wp.thread_mode = MSKV_UCS_THREAD_MODE_SINGLE;
        s = u->fn.ucp_worker_create(u->ctx, &wp, &u->worker);
        if (s != MSKV_UCS_OK) { u->fn.ucp_cleanup(u->ctx); u->ctx = NULL; }
        else if ((cp.features & MSKV_UCP_FEATURE_WAKEUP) && u->fn.ucp_worker_get_efd(u->worker, &u->efd) != MSKV_UCS_OK) u->efd = -1;
    }
    if (s != MSKV_UCS_OK) {
        r = mskv__ucx_err(u, MSKV_ERROR_UNSUPPORTED, "ucx: no UCP context/worker: %s", mskv__ucx_status(u, s));
        mskv__ucx_lib_close(u->lib);
        mskv__free(&al, u->iov_mem);
        mskv__free(&al, u);
        return r;
    }
    *out = u;
    return MSKV_SUCCESS;
}

#define MSKV__UCX_SPIN 64        /* idle polls before a wait sleeps on the event fd */
#define MSKV__UCX_NAP_MS 20       /* the longest sleep between clock checks */

/* One idle moment of a wait: after a brief spin, arm the worker and sleep
   on its event fd until something arrives (or a short nap passes); without
   an event fd, yield the processor. Returns whether it slept. */
static int mskv__ucx_idle(mskv_ucx *u, unsigned idle) {
    int i, pages = 0;
    if (idle <= MSKV__UCX_SPIN) return 0;
    /* pages in flight that may come or go by shared memory: the worker's event fd does not reliably wake for
       them (UCX 1.13; a 384 MiB move took 6 s instead of 0.4 in the 20 ms naps), so yield to the peer instead */
    for (i = 0; u->ctx_shm && !pages && i < MSKV__UCX_WINDOW; i++) pages = u->ops[i].busy;
    if (u->efd >= 0 && !pages) {
        /* BUSY: events are pending, progress again at once */
        if (u->fn.ucp_worker_arm(u->worker) == MSKV_UCS_OK) {
            mskv__ucx_sleep_on(u->efd, MSKV__UCX_NAP_MS);
            return 1;
        }
        return 0;
    }
    mskv__ucx_yield();
    return 0;
}

/* Polls the worker until *flag is set, the endpoint fails, or timeout_ms
   pass with no progress (every op that completes counts as progress). */
static mskv_result mskv__ucx_wait(mskv_ucx *u, const int *flag, const char *what) {
    int64_t last = mskv__ucx_now_ms();
    unsigned idle = 0;
    while (!*flag) {
        int slept;
        if (u->fn.ucp_worker_progress(u->worker)) {
            idle = 0;
            last = mskv__ucx_now_ms();
        }
        if (*flag) break;
        if (u->failed)
            return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: %s: the connection failed: %s", what, mskv__ucx_status(u, u->failed));
        slept = mskv__ucx_idle(u, ++idle);
        /* the clock only after a sleep or now and then: reading it every spin costs more than the progress */
        if ((slept || idle % 256 == 0) && mskv__ucx_now_ms() - last > u->desc.timeout_ms)
            return mskv__ucx_err(u, MSKV_ERROR_TIMEOUT, "ucx: %s: no progress for %d ms", what, (int)u->desc.timeout_ms);
    }
    return MSKV_SUCCESS;
}

/* Before a refusing side ends the connection: the answer it just sent is only
   handed to the transport, and a forced close (a reset, over TCP) can drop it
   on the way or make the peer's system discard it unread, so the peer would see
   a broken connection, not the refusal. The peer ends the connection itself
   once it has read the answer; wait for that, ms at most (a peer that never
   reads costs this much and no more). */
static void mskv__ucx_linger(mskv_ucx *u, int ms) {
    int64_t start = mskv__ucx_now_ms();
    unsigned idle = 0;
    while (!u->failed && mskv__ucx_now_ms() - start < ms) {
        if (u->fn.ucp_worker_progress(u->worker)) idle = 0;
        else (void)mskv__ucx_idle(u, ++idle);
    }
}

/* An op after UCX took it: done now (NULL or an error) or in flight. */
static void mskv__ucx_started(mskv_ucx *u, mskv__ucx_op *op, mskv_ucs_status_ptr p) {
    op->busy = 1;
    op->req = NULL;
    if (p == NULL) {
        op->done = 1;
        op->status = MSKV_UCS_OK;
    } else if ((uintptr_t)p >= (uintptr_t)(intptr_t)MSKV_UCS_ERR_LAST) {   /* UCS_PTR_IS_ERR */
        op->done = 1;
        op->status = (mskv_ucs_status)(intptr_t)p;
    } else {
        op->req = p;
    }
    (void)u;
}

/* Frees a completed op's request. */
static void mskv__ucx_finish(mskv_ucx *u, mskv__ucx_op *op) {
    if (op->req) u->fn.ucp_request_free(op->req);
    op->req = NULL;
    op->busy = 0;
}

static void mskv__ucx_param(mskv_ucp_request_param *p, mskv__ucx_op *op, int recv, mskv_ucp_datatype dt) {
    memset(p, 0, sizeof *p);
    p->op_attr_mask = MSKV_UCP_OP_ATTR_FIELD_CALLBACK | MSKV_UCP_OP_ATTR_FIELD_USER_DATA | MSKV_UCP_OP_ATTR_FIELD_DATATYPE;
    if (recv) {
        p->cb.recv = mskv__ucx_on_recv;
        /* always through the callback: UCX 1.13 completing a receive at once from its
           unexpected queue (an eager message after rendezvous ones) left the length 0 */
        p->op_attr_mask |= MSKV_UCP_OP_ATTR_FIELD_RECV_INFO | MSKV_UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        p->recv_info.tag_info = &op->info;
    } else {
        p->cb.send = mskv__ucx_on_send;
    }
    p->user_data = op;
    p->datatype = dt;
}

static mskv_result mskv__ucx_data_ep(mskv_ucx *u);

/* The endpoint a message goes on: the pages on the data endpoint (made
   now if it is not there yet), everything else on the connection's. */
static void mskv__ucx_send_op(mskv_ucx *u, mskv__ucx_op *op, mskv_ucp_tag tag, const void *buf, size_t count, mskv_ucp_datatype dt) {
    mskv_ucp_request_param p;
    mskv_ucp_ep ep = u->ep;
    memset(&op->info, 0, sizeof op->info);
    op->done = 0;
    op->why = MSKV_SUCCESS;
    if (u->lanes == 2 && u->data_lane != 1 && (tag >> 56) == MSKV__UCX_DATA) {
        mskv_result r = u->data_lane ? MSKV_SUCCESS : mskv__ucx_data_ep(u);
        if (r != MSKV_SUCCESS) {
            /* as an op that failed at once: its wait returns r */
            op->busy = 1;
            op->req = NULL;
            op->done = 1;
            op->status = MSKV_UCS_ERR_CANCELED;
            op->why = r;
            return;
        }
        if (u->data_lane == 2) ep = u->data_ep;
    }
    mskv__ucx_param(&p, op, 0, dt);
    mskv__ucx_started(u, op, u->fn.ucp_tag_send_nbx(ep, buf, count, tag, &p));
}

static void mskv__ucx_recv_op(mskv_ucx *u, mskv__ucx_op *op, mskv_ucp_tag tag, void *buf, size_t count, mskv_ucp_datatype dt) {
    mskv_ucp_request_param p;
    memset(&op->info, 0, sizeof op->info);
    op->done = 0;
    op->why = MSKV_SUCCESS;
    mskv__ucx_param(&p, op, 1, dt);
    mskv__ucx_started(u, op, u->fn.ucp_tag_recv_nbx(u->worker, buf, count, tag, ~(mskv_ucp_tag)0, &p));
}

/* Waits for one op and frees it; PEER when it completed with an error. */
static mskv_result mskv__ucx_complete(mskv_ucx *u, mskv__ucx_op *op, const char *what) {
    mskv_result r = mskv__ucx_wait(u, &op->done, what);
    if (r != MSKV_SUCCESS) return r;
    mskv__ucx_finish(u, op);
    if (op->why != MSKV_SUCCESS) return op->why;   /* already logged */
    if (op->status != MSKV_UCS_OK)
        return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: %s: %s", what, mskv__ucx_status(u, op->status));
    return MSKV_SUCCESS;
}

/* Withdraws one in-flight receive (the connection stays as it is). */
static void mskv__ucx_cancel(mskv_ucx *u, mskv__ucx_op *op) {
    int spins;
    if (!op->busy) return;
    if (op->req && !op->done) u->fn.ucp_request_cancel(u->worker, op->req);
    for (spins = 0; spins < 1000000 && !op->done; spins++) u->fn.ucp_worker_progress(u->worker);
    if (op->done) mskv__ucx_finish(u, op);
    else op->busy = 0;   /* UCX never finished it: its request is leaked rather than freed under it */
}

static int mskv__ucx_any_busy(const mskv_ucx *u) {
    int i;
    for (i = 0; i < (int)(sizeof u->ops / sizeof u->ops[0]); i++)
        if (u->ops[i].busy) return 1;
    return 0;
}

/* Closes an endpoint: forced (PEER mode: in-flight sends complete with an
   error at once) or flushed (the data endpoint: UCX refuses to force a
   MODE_NONE one), waiting ms at most; a close that does not finish in
   time is left to the worker's destruction. Returns whether it finished. */
static int mskv__ucx_close_ep(mskv_ucx *u, mskv_ucp_ep ep, int force, int ms) {
    mskv_ucp_request_param p;
    mskv_ucs_status_ptr c;
    int64_t start = mskv__ucx_now_ms();
    unsigned spins = 0;
    memset(&p, 0, sizeof p);
    if (force) {
        p.op_attr_mask = MSKV_UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = MSKV_UCP_EP_CLOSE_FLAG_FORCE;
    }
    c = u->fn.ucp_ep_close_nbx(ep, &p);
    if (c && (uintptr_t)c < (uintptr_t)(intptr_t)MSKV_UCS_ERR_LAST) {
        int done;
        while (u->fn.ucp_request_check_status(c) == MSKV_UCS_INPROGRESS && (++spins % 64 != 0 || mskv__ucx_now_ms() - start <= ms))
            u->fn.ucp_worker_progress(u->worker);
        done = u->fn.ucp_request_check_status(c) != MSKV_UCS_INPROGRESS;
        u->fn.ucp_request_free(c);   /* released by UCX when it completes, if it has not */
        return done;
    }
    return 1;
}

#define MSKV__UCX_GIVE_UP_MS 200   /* how long a broken connection's sends may take to come back */

/* The connection is given up: the connection's endpoint closed at once (in-flight sends
   complete with an error), the data endpoint flushed for a moment, pending
   receives cancelled, and every op's callback run before its memory may be
   reused; an op UCX does not give back in MSKV__UCX_GIVE_UP_MS (a send on
   the data endpoint to a stopped peer) is abandoned: its callback may still
   run, into this object, until the worker is destroyed. */
static void mskv__ucx_break(mskv_ucx *u) {
    int i, busy;
    int64_t start;
    unsigned spins = 0;
    mskv__ucx_op *all[MSKV__UCX_WINDOW + 5];
    int n = 0;
    if (u->ep) {
        mskv__ucx_close_ep(u, u->ep, 1, (int)u->desc.timeout_ms);   /* a forced close needs no peer: it finishes */
        u->ep = NULL;
    }
    if (u->data_ep) {
        /* sends that the transport cannot take (a stopped or dead peer's full FIFO) stay queued on it, and
           UCX 1.13 aborts the process (ucs_bug) when it destroys a worker with such a queue: then the
           worker is left as it is (mskv_ucx_destroy) */
        if (!mskv__ucx_close_ep(u, u->data_ep, 0, MSKV__UCX_GIVE_UP_MS)) u->stuck = 1;
        u->data_ep = NULL;
    }
    for (i = 0; i < (int)(sizeof u->ops / sizeof u->ops[0]); i++) all[n++] = &u->ops[i];
    all[n++] = &u->addr_ops[0];
    all[n++] = &u->addr_ops[1];
    for (i = 0; i < n; i++)
        if (all[i]->busy && all[i]->req && !all[i]->done) u->fn.ucp_request_cancel(u->worker, all[i]->req);
    start = mskv__ucx_now_ms();
    do {
        busy = 0;
        for (i = 0; i < n; i++) {
            if (all[i]->busy && all[i]->done) mskv__ucx_finish(u, all[i]);
            busy |= all[i]->busy;
        }
        if (busy) u->fn.ucp_worker_progress(u->worker);
    } while (busy && (++spins % 64 != 0 || mskv__ucx_now_ms() - start <= MSKV__UCX_GIVE_UP_MS));
    for (i = 0; i < n; i++) all[i]->busy = 0;   /* not given back: leaked rather than freed under UCX */
    u->broken = 1;
}

/* The transports (UCX's "transport/device" names, each once, in lane
   order) of ep's lanes that carry tag messages, from ucp_ep_print_info's
   report: lines "lane[i]: r:tl/dev.path md[m] -> md[m]/comp/sysdev[s] am
   am_bw#0 ...", where am, am_bw#, rma_bw# and tag_offload are the tag
   protocols' lanes (eager, rendezvous) and a cm lane is the connection
   manager's. "none" when no lane is one (yet). */
static mskv_result mskv__ucx_ep_lanes(mskv_ucx *u, mskv_ucp_ep ep, char *out, size_t cap) {
    FILE *f = tmpfile();
    char line[1024];
    size_t n = 0;
    if (!f) return mskv__ucx_err(u, MSKV_ERROR_IO, "ucx_lanes: no temporary file for UCX's endpoint report");
    out[0] = 0;
    u->fn.ucp_ep_print_info(ep, f);
    rewind(f);
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "lane["), *name, *end, *tok;
        int tag = 0;
        size_t k;
        if (!p || !(p = strchr(p, ':'))) continue;
        for (p++; *p == ' '; p++) {}
        if (strncmp(p, "cm ", 3) == 0 || !(p = strchr(p, ':'))) continue;   /* the connection manager's lane; else "r:" */
        name = p + 1;
        end = strchr(name, ' ');
        tok = strstr(name, "->");
        if (!end || !tok) continue;
        *end = 0;
        k = strlen(name);
        while (k > 0 && name[k - 1] >= '0' && name[k - 1] <= '9') k--;   /* ".path" */
        if (k > 0 && name[k - 1] == '.') name[k - 1] = 0;
        for (tok += 2; *tok;) {   /* the words after "->" (no strtok: its state is shared by every thread) */
            size_t w;
            while (*tok == ' ' || *tok == '\t' || *tok == '\r' || *tok == '\n') tok++;
            for (w = 0; tok[w] && tok[w] != ' ' && tok[w] != '\t' && tok[w] != '\r' && tok[w] != '\n'; w++) {}
            if ((w == 2 && strncmp(tok, "am", 2) == 0) || (w > 6 && strncmp(tok, "am_bw#", 6) == 0) || (w > 7 && strncmp(tok, "rma_bw#", 7) == 0) ||
                (w == 11 && strncmp(tok, "tag_offload", 11) == 0))
                tag = 1;
            tok += w;
        }
        if (!tag || !*name) continue;
        {
            /* once each: a whole word of out already? */
            const char *at = out;
            size_t nl = strlen(name);
            int seen = 0;
            while ((at = strstr(at, name)) != NULL) {
                if ((at == out || at[-1] == ' ') && (at[nl] == 0 || at[nl] == ' ')) { seen = 1; break; }
                at += nl;
            }
            if (seen || n + (n ? 1 : 0) + nl + 1 > cap) continue;
            if (n) out[n++] = ' ';
            memcpy(out + n, name, nl + 1);
            n += nl;
        }
    }
    fclose(f);
    if (n == 0) mskv__ucx_copystr(out, cap, "none");
    return MSKV_SUCCESS;
}

/* Whether a list of "transport/device" words names one of UCX's
   shared-memory transports. */
static int mskv__ucx_has_shm(const char *lanes) {
    static const char *const shm[] = {"posix/", "sysv/", "cma/", "knem/", "xpmem/"};
    const char *p = lanes;
    while (*p) {
        size_t i;
        while (*p == ' ') p++;
        for (i = 0; i < sizeof shm / sizeof shm[0]; i++)
            if (strncmp(p, shm[i], strlen(shm[i])) == 0) return 1;
        while (*p && *p != ' ') p++;
    }
    return 0;
}

/* Whether this context has a shared-memory transport at all (UCX_TLS
   allows one): ucp_context_print_info's "resource" lines end in
   "transport/device". */
static int mskv__ucx_context_shm(mskv_ucx *u) {
    FILE *f = tmpfile();
    char line[512];
    int shm = 0;
    if (!f) return 1;   /* no way to tell: let the data endpoint's lanes decide */
    u->fn.ucp_context_print_info(u->ctx, f);
    rewind(f);
    while (!shm && fgets(line, sizeof line, f)) {
        char *w;
        size_t k = strlen(line);
        if (!strstr(line, "resource")) continue;
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ')) line[--k] = 0;
        w = strrchr(line, ' ');
        if (w && mskv__ucx_has_shm(w + 1)) shm = 1;
    }
    fclose(f);
    return shm;
}

/* Which machine this is, as far as shared memory goes: SHA-256 of the
   running kernel's boot id (Linux), zeros when unknown. */
static void mskv__ucx_host_id(unsigned char out[32]) {
    char id[128];
    size_t n = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    memset(out, 0, 32);
    if (f) {
        n = fread(id, 1, sizeof id, f);
        fclose(f);
    }
    if (n > 0) mskv_sha256(id, n, out);
}

#define MSKV__UCX_ADDRESS_FIXED 40u   /* ADDRESS: magic, version, the host id; then the worker address, or none */

/* Our ADDRESS to the peer, and the peer's awaited, on the connection's
   endpoint just made through the connection manager: a data endpoint is
   made from them when both sides are on one host and have shared memory.
   Sent whatever our lanes (the peer's may be 2), with no worker address
   when we have no shared-memory transport (the peer then sends its pages
   on the connection). */
static mskv_result mskv__ucx_exchange_addresses(mskv_ucx *u) {
    mskv_ucs_status s = MSKV_UCS_OK;
    size_t n = 0;
    int shm = u->ctx_shm = mskv__ucx_context_shm(u);
    if (shm && !u->my_addr) s = u->fn.ucp_worker_get_address(u->worker, &u->my_addr, &u->my_addr_len);
    if (s != MSKV_UCS_OK || (shm && u->my_addr_len > MSKV__UCX_HELLO_MAX - MSKV__UCX_ADDRESS_FIXED)) {
        if (s != MSKV_UCS_OK) u->my_addr = NULL;
        return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: no worker address of ours (%zu bytes, at most %u): %s", s == MSKV_UCS_OK ? u->my_addr_len : (size_t)0,
                             (unsigned)(MSKV__UCX_HELLO_MAX - MSKV__UCX_ADDRESS_FIXED), mskv__ucx_status(u, s));
    }
    if (shm) n = u->my_addr_len;
    u->addr_msg = (unsigned char *)mskv__alloc(&u->al, MSKV__UCX_ADDRESS_FIXED + n);
    if (!u->addr_msg) return mskv__ucx_err(u, MSKV_ERROR_OUT_OF_MEMORY, "ucx: %zu bytes for our worker address", MSKV__UCX_ADDRESS_FIXED + n);
    /* received even when unused: UCX warns about an unexpected message left at the worker's destruction */
    u->peer_addr = (unsigned char *)mskv__alloc(&u->al, MSKV__UCX_HELLO_MAX);
    if (!u->peer_addr) return mskv__ucx_err(u, MSKV_ERROR_OUT_OF_MEMORY, "ucx: %u bytes for the peer's worker address", (unsigned)MSKV__UCX_HELLO_MAX);
    mskv__ucx_recv_op(u, &u->addr_ops[1], MSKV__UCX_TAG(MSKV__UCX_ADDRESS, 0), u->peer_addr, MSKV__UCX_HELLO_MAX, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    if (u->lanes != 2 || !shm) u->data_lane = 1;   /* nothing to gain: no shared memory here, or one endpoint asked for */
    mskv__ucx_put32(u->addr_msg, MSKV__UCX_MAGIC);
    mskv__ucx_put32(u->addr_msg + 4, MSKV__UCX_PROTOCOL);
    mskv__ucx_host_id(u->addr_msg + 8);
    if (n) memcpy(u->addr_msg + MSKV__UCX_ADDRESS_FIXED, u->my_addr, n);
    mskv__ucx_send_op(u, &u->addr_ops[0], MSKV__UCX_TAG(MSKV__UCX_ADDRESS, 0), u->addr_msg, MSKV__UCX_ADDRESS_FIXED + n, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    return MSKV_SUCCESS;
}

/* The rendezvous: the peer's worker address is known already (its host
   is not: the data endpoint's lanes decide). */
static mskv_result mskv__ucx_keep_peer_address(mskv_ucx *u, const void *address, size_t bytes) {
    u->ctx_shm = mskv__ucx_context_shm(u);
    if (u->lanes != 2 || !u->ctx_shm) {
        u->data_lane = 1;
        return MSKV_SUCCESS;
    }
    u->peer_addr = (unsigned char *)mskv__alloc(&u->al, bytes);
    if (!u->peer_addr) return mskv__ucx_err(u, MSKV_ERROR_OUT_OF_MEMORY, "ucx: %zu bytes for the peer's worker address", bytes);
    memcpy(u->peer_addr, address, bytes);
    u->peer_addr_len = bytes;
    u->have_peer_addr = 1;
    return MSKV_SUCCESS;
}

/* Decides where the pages go (u->data_lane), once: a data endpoint to the
   peer's worker (MODE_NONE: the shared-memory transports take it) when
   the peer sent a worker address from this host (waiting for its ADDRESS
   if it has not come yet) and UCX gives the endpoint a shared-memory
   transport; else the connection's endpoint, whose failure detection a
   MODE_NONE endpoint over TCP would only lose (a data endpoint made
   anyway, by worker address to another host, stays unused: closing it
   could wait on its wireup, and the worker's destruction removes it).
   PEER or TIMEOUT when the ADDRESS is bad or does not come in timeout_ms. */
static mskv_result mskv__ucx_data_ep(mskv_ucx *u) {
    mskv_ucp_ep_params ep;
    mskv_ucs_status s;
    mskv_result r;
    char lanes[256];
    mskv_ucp_ep made = NULL;
    if (u->data_lane) return MSKV_SUCCESS;
    if (!u->ep) return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: the connection is closed");
    if (!u->have_peer_addr) {
        mskv__ucx_op *op = &u->addr_ops[1];
        unsigned char here[32];
        r = op->busy ? mskv__ucx_complete(u, op, "waiting for the peer's worker address")
                     : mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: no worker address of the peer is on its way");
        if (r == MSKV_SUCCESS && (op->info.length < MSKV__UCX_ADDRESS_FIXED || mskv__ucx_get32(u->peer_addr) != MSKV__UCX_MAGIC ||
                                  mskv__ucx_get32(u->peer_addr + 4) != MSKV__UCX_PROTOCOL))
            r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: the peer's ADDRESS message is not this protocol's (%zu bytes; version %u)", op->info.length,
                              (unsigned)MSKV__UCX_PROTOCOL);
        if (r != MSKV_SUCCESS) return r;
        mskv__ucx_host_id(here);
        if (op->info.length == MSKV__UCX_ADDRESS_FIXED || memcmp(here, u->peer_addr + 8, 32) != 0) {
            u->data_lane = 1;   /* no shared memory there, or another host */
            return MSKV_SUCCESS;
        }
        u->peer_addr_len = op->info.length - MSKV__UCX_ADDRESS_FIXED;
        memmove(u->peer_addr, u->peer_addr + MSKV__UCX_ADDRESS_FIXED, u->peer_addr_len);
        u->have_peer_addr = 1;
    }
    memset(&ep, 0, sizeof ep);
    ep.field_mask = MSKV_UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = u->peer_addr;
    ep.err_mode = MSKV_UCP_ERR_HANDLING_MODE_NONE;   /* a transport error still reaches the handler: the connection fails */
    ep.err_handler.cb = mskv__ucx_on_error;
    ep.err_handler.arg = u;
    s = u->fn.ucp_ep_create(u->worker, &ep, &made);
    if (s != MSKV_UCS_OK) return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: no data endpoint to the peer's worker: %s", mskv__ucx_status(u, s));
    r = mskv__ucx_ep_lanes(u, made, lanes, sizeof lanes);   /* IO (no temporary file): the connection's endpoint then */
    u->data_lane = r == MSKV_SUCCESS && mskv__ucx_has_shm(lanes) ? 2 : 1;
    if (u->data_lane == 2) u->data_ep = made;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_ucx_listen(const mskv_ucx_desc *desc, const char *ip, uint16_t port, mskv_ucx **out) {
    mskv_ucx *u;
    mskv_ucp_listener_params lp;
    mskv_ucs_status s;
    mskv_result r;
    if (!ip || !out) return MSKV_ERROR_NULL_POINTER;
    r = mskv__ucx_create(desc, &u);
    if (r != MSKV_SUCCESS) return r;
    if (!mskv__ucx_sockaddr(ip, port, u->addr, &u->addrlen)) {
        r = mskv__ucx_err(u, MSKV_ERROR_INVALID_ARGUMENT, "ucx_listen: \"%s\" is not an IPv4 address", ip);
        mskv_ucx_destroy(u);
        return r;
    }
    memset(&lp, 0, sizeof lp);
    lp.field_mask = MSKV_UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | MSKV_UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = u->addr;
    lp.sockaddr.addrlen = u->addrlen;
    lp.conn_handler.cb = mskv__ucx_on_conn;
    lp.conn_handler.arg = u;
    s = u->fn.ucp_listener_create(u->worker, &lp, &u->listener);
    if (s != MSKV_UCS_OK) {
        r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_listen: %s:%u: %s", ip, (unsigned)port, mskv__ucx_status(u, s));
        mskv_ucx_destroy(u);
        return r;
    }
    u->is_listener = 1;
    *out = u;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_ucx_port(mskv_ucx *u, uint16_t *port) {
    mskv_ucp_listener_attr at;
    mskv_ucs_status s;
    if (!u || !port) return MSKV_ERROR_NULL_POINTER;
    if (!u->listener) return mskv__ucx_err(u, MSKV_ERROR_BAD_STATE, "ucx_port: not a listener");
    memset(&at, 0, sizeof at);
    at.field_mask = MSKV_UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    s = u->fn.ucp_listener_query(u->listener, &at);
    if (s != MSKV_UCS_OK) return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_port: %s", mskv__ucx_status(u, s));
    *port = mskv__ucx_sockaddr_port(at.sockaddr.bytes);
    return MSKV_SUCCESS;
}

static mskv_result mskv__ucx_make_ep(mskv_ucx *u, mskv_ucp_conn_request from) {
    mskv_ucp_ep_params ep;
    mskv_ucs_status s;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_mode = MSKV_UCP_ERR_HANDLING_MODE_PEER;   /* a dead peer fails the endpoint instead of hanging it */
    ep.err_handler.cb = mskv__ucx_on_error;
    ep.err_handler.arg = u;
    if (from) {
        ep.field_mask |= MSKV_UCP_EP_PARAM_FIELD_CONN_REQUEST;
        ep.conn_request = from;
    } else {
        ep.field_mask |= MSKV_UCP_EP_PARAM_FIELD_FLAGS | MSKV_UCP_EP_PARAM_FIELD_SOCK_ADDR;
        ep.flags = MSKV_UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        ep.sockaddr.addr = u->addr;
        ep.sockaddr.addrlen = u->addrlen;
    }
    s = u->fn.ucp_ep_create(u->worker, &ep, &u->ep);
    if (s != MSKV_UCS_OK) {
        u->ep = NULL;
        return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: no endpoint: %s", mskv__ucx_status(u, s));
    }
    return MSKV_SUCCESS;
}

/* A fresh challenge per connection: every offer's MAC covers it, so none replays onto another connection. */
static mskv_result mskv__ucx_send_challenge(mskv_ucx *u) {
    mskv__ucx_op *op = &u->ops[MSKV__UCX_WINDOW + 2];
    mskv_result r;
    mskv__ucx_put32(u->challenge, MSKV__UCX_MAGIC);
    mskv__ucx_put32(u->challenge + 4, MSKV__UCX_PROTOCOL);
    mskv__ucx_random(u->challenge + 8);
    mskv__ucx_send_op(u, op, MSKV__UCX_TAG(MSKV__UCX_CHALLENGE, 0), u->challenge, sizeof u->challenge, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    r = mskv__ucx_complete(u, op, "sending the challenge");
    if (r != MSKV_SUCCESS) mskv__ucx_break(u);
    return r;
}

MSKV_IMPL mskv_result mskv_ucx_listen_address(const mskv_ucx_desc *desc, mskv_ucx **out) {
    mskv_ucx *u;
    mskv_ucs_status s;
    mskv_result r;
    if (!out) return MSKV_ERROR_NULL_POINTER;
    r = mskv__ucx_create(desc, &u);
    if (r != MSKV_SUCCESS) return r;
    u->hello = (unsigned char *)mskv__alloc(&u->al, MSKV__UCX_HELLO_MAX);
    if (!u->hello) { mskv_ucx_destroy(u); return MSKV_ERROR_OUT_OF_MEMORY; }
    s = u->fn.ucp_worker_get_address(u->worker, &u->my_addr, &u->my_addr_len);
    if (s != MSKV_UCS_OK) {
        u->my_addr = NULL;
        r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_listen_address: no worker address: %s", mskv__ucx_status(u, s));
        mskv_ucx_destroy(u);
        return r;
    }
    u->is_listener = 1;
    u->by_address = 1;
    *out = u;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_ucx_address(mskv_ucx *u, const void **address, size_t *bytes) {
    if (!u || !address || !bytes) return MSKV_ERROR_NULL_POINTER;
    if (!u->by_address || !u->my_addr) return mskv__ucx_err(u, MSKV_ERROR_BAD_STATE, "ucx_address: not made by mskv_ucx_listen_address");
    *address = u->my_addr;
    *bytes = u->my_addr_len;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_ucx_connect_address(const mskv_ucx_desc *desc, const void *address, size_t bytes, mskv_ucx **out) {
    mskv_ucx *u;
    mskv_ucp_ep_params ep;
    mskv_ucs_status s;
    mskv_result r;
    unsigned char *hello;
    if (!out) return MSKV_ERROR_NULL_POINTER;
    if (!address || bytes == 0 || bytes > MSKV__UCX_HELLO_MAX - 8) {
        if (desc && desc->log) {
            char msg[160];
            snprintf(msg, sizeof msg, "ucx_connect_address: an address of %zu bytes (1 to %u)", address ? bytes : (size_t)0, (unsigned)(MSKV__UCX_HELLO_MAX - 8));
            desc->log(desc->log_user, MSKV_LOG_ERROR, msg);
        }
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    r = mskv__ucx_create(desc, &u);
    if (r != MSKV_SUCCESS) return r;
    s = u->fn.ucp_worker_get_address(u->worker, &u->my_addr, &u->my_addr_len);
    if (s != MSKV_UCS_OK || u->my_addr_len > MSKV__UCX_HELLO_MAX - 8) {
        if (s != MSKV_UCS_OK) u->my_addr = NULL;
        r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_connect_address: no worker address of ours: %s", mskv__ucx_status(u, s));
        mskv_ucx_destroy(u);
        return r;
    }
    r = mskv__ucx_keep_peer_address(u, address, bytes);
    if (r != MSKV_SUCCESS) { mskv_ucx_destroy(u); return r; }
    memset(&ep, 0, sizeof ep);
    ep.field_mask = MSKV_UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = address;
    ep.err_mode = MSKV_UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = mskv__ucx_on_error;
    ep.err_handler.arg = u;
    s = u->fn.ucp_ep_create(u->worker, &ep, &u->ep);
    if (s != MSKV_UCS_OK) {
        u->ep = NULL;
        r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_connect_address: no endpoint: %s", mskv__ucx_status(u, s));
        mskv_ucx_destroy(u);
        return r;
    }
    hello = (unsigned char *)mskv__alloc(&u->al, 8 + u->my_addr_len);
    if (!hello) { mskv_ucx_destroy(u); return MSKV_ERROR_OUT_OF_MEMORY; }
    mskv__ucx_put32(hello, MSKV__UCX_MAGIC);
    mskv__ucx_put32(hello + 4, MSKV__UCX_PROTOCOL);
    memcpy(hello + 8, u->my_addr, u->my_addr_len);
    mskv__ucx_recv_op(u, &u->ops[MSKV__UCX_WINDOW + 2], MSKV__UCX_TAG(MSKV__UCX_CHALLENGE, 0), u->challenge, sizeof u->challenge,
                      MSKV_UCP_DATATYPE_CONTIG_BYTE);
    mskv__ucx_send_op(u, &u->ops[MSKV__UCX_WINDOW], MSKV__UCX_TAG(MSKV__UCX_HELLO, 0), hello, 8 + u->my_addr_len, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    r = mskv__ucx_complete(u, &u->ops[MSKV__UCX_WINDOW], "sending the hello");
    mskv__free(&u->al, hello);
    if (r != MSKV_SUCCESS) { mskv_ucx_destroy(u); return r; }
    *out = u;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_ucx_accept(mskv_ucx *u) {
    mskv_result r;
    int64_t start;
    if (!u) return MSKV_ERROR_NULL_POINTER;
    if (!u->is_listener || u->ep || u->broken) return mskv__ucx_err(u, MSKV_ERROR_BAD_STATE, "ucx_accept: not a listener, or connected already");
    if (u->by_address) {
        /* the sender's hello: its worker address, so that replies have an endpoint */
        mskv__ucx_op *op = &u->ops[MSKV__UCX_WINDOW];
        mskv_ucp_ep_params ep;
        mskv_ucs_status s;
        if (!op->busy) mskv__ucx_recv_op(u, op, MSKV__UCX_TAG(MSKV__UCX_HELLO, 0), u->hello, MSKV__UCX_HELLO_MAX, MSKV_UCP_DATATYPE_CONTIG_BYTE);
        r = mskv__ucx_complete(u, op, "waiting for a sender's hello");
        if (r == MSKV_ERROR_TIMEOUT) return r;   /* the receive stays posted: call again */
        if (r != MSKV_SUCCESS) return r;
        if (op->info.length < 9 || mskv__ucx_get32(u->hello) != MSKV__UCX_MAGIC || mskv__ucx_get32(u->hello + 4) != MSKV__UCX_PROTOCOL)
            return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_accept: a hello that is not this protocol's (version %u)", (unsigned)MSKV__UCX_PROTOCOL);
        memset(&ep, 0, sizeof ep);
        ep.field_mask = MSKV_UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.address = u->hello + 8;
        ep.err_mode = MSKV_UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = mskv__ucx_on_error;
        ep.err_handler.arg = u;
        r = mskv__ucx_keep_peer_address(u, u->hello + 8, op->info.length - 8);
        if (r != MSKV_SUCCESS) return r;
        s = u->fn.ucp_ep_create(u->worker, &ep, &u->ep);
        if (s != MSKV_UCS_OK) {
            u->ep = NULL;
            return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_accept: no endpoint to the sender's address: %s", mskv__ucx_status(u, s));
        }
        return mskv__ucx_send_challenge(u);
    }
    start = mskv__ucx_now_ms();
    while (!u->pending) {
        unsigned spin;
        for (spin = 0; spin <= MSKV__UCX_SPIN + 1 && !u->pending; spin++)
            if (!u->fn.ucp_worker_progress(u->worker) && !u->pending) (void)mskv__ucx_idle(u, spin);
        if (!u->pending && mskv__ucx_now_ms() - start > u->desc.timeout_ms)
            return mskv__ucx_err(u, MSKV_ERROR_TIMEOUT, "ucx_accept: no peer connected within %d ms", (int)u->desc.timeout_ms);
    }
    r = mskv__ucx_make_ep(u, u->pending);
    u->pending = NULL;
    if (r == MSKV_SUCCESS) r = mskv__ucx_send_challenge(u);
    if (r == MSKV_SUCCESS) {
        r = mskv__ucx_exchange_addresses(u);
        if (r != MSKV_SUCCESS) mskv__ucx_break(u);
    }
    return r;
}

MSKV_IMPL mskv_result mskv_ucx_connect(const mskv_ucx_desc *desc, const char *ip, uint16_t port, mskv_ucx **out) {
    mskv_ucx *u;
    mskv_result r;
    if (!ip || !out) return MSKV_ERROR_NULL_POINTER;
    r = mskv__ucx_create(desc, &u);
    if (r != MSKV_SUCCESS) return r;
    if (!mskv__ucx_sockaddr(ip, port, u->addr, &u->addrlen)) r = mskv__ucx_err(u, MSKV_ERROR_INVALID_ARGUMENT, "ucx_connect: \"%s\" is not an IPv4 address", ip);
    if (r == MSKV_SUCCESS) r = mskv__ucx_make_ep(u, NULL);
    if (r != MSKV_SUCCESS) { mskv_ucx_destroy(u); return r; }
    /* the receiver's challenge comes first; the first send waits for it */
    mskv__ucx_recv_op(u, &u->ops[MSKV__UCX_WINDOW + 2], MSKV__UCX_TAG(MSKV__UCX_CHALLENGE, 0), u->challenge, sizeof u->challenge,
                      MSKV_UCP_DATATYPE_CONTIG_BYTE);
    r = mskv__ucx_exchange_addresses(u);
    if (r != MSKV_SUCCESS) { mskv_ucx_destroy(u); return r; }
    *out = u;
    return MSKV_SUCCESS;
}

MSKV_IMPL void mskv_ucx_destroy(mskv_ucx *u) {
    mskv_allocator al;
    if (!u) return;
    al = u->al;
    if (u->data_ep) {
        /* every page it carried was acknowledged on the connection (or the connection broke, which closed it) */
        if (!mskv__ucx_close_ep(u, u->data_ep, 0, (int)u->desc.timeout_ms)) u->stuck = 1;
        u->data_ep = NULL;
    }
    if (u->ep && !(u->addr_ops[0].busy && !u->addr_ops[0].done)) {
        /* a graceful close flushes what was sent; a peer that is gone makes it fail, which is fine. An endpoint
           whose first message never left (it never connected) is closed by force instead (mskv__ucx_break): a
           flush would wait for a connection that does not come, and leave the message queued */
        (void)mskv__ucx_close_ep(u, u->ep, 0, (int)u->desc.timeout_ms);
        u->ep = NULL;
    }
    mskv__ucx_break(u);
    if (u->stuck) {
        /* UCX 1.13 aborts the process (ucs_bug) destroying a worker with sends queued on a MODE_NONE endpoint
           it cannot drain (a stopped or dead peer's full shared-memory FIFO): the worker, and this object that
           its callbacks may still write, are left rather than the process killed */
        if (u->desc.log)
            u->desc.log(u->desc.log_user, MSKV_LOG_WARN, "ucx_destroy: the data endpoint to a stopped or dead peer did not drain: its UCX worker "
                                                         "and this object are left allocated (UCX 1.13 aborts destroying them)");
        return;
    }
    if (u->pending) u->fn.ucp_listener_reject(u->listener, u->pending);
    if (u->my_addr) u->fn.ucp_worker_release_address(u->worker, u->my_addr);
    mskv__free(&al, u->hello);
    if (u->listener) u->fn.ucp_listener_destroy(u->listener);
    if (u->worker) u->fn.ucp_worker_destroy(u->worker);
    if (u->ctx) u->fn.ucp_cleanup(u->ctx);
    mskv__ucx_lib_close(u->lib);
    mskv__free(&al, u->iov_mem);
    mskv__free(&al, u->addr_msg);
    mskv__free(&al, u->peer_addr);
    mskv__free(&al, u);
}

MSKV_IMPL mskv_result mskv_ucx_lanes(mskv_ucx *u, char *buf, size_t cap) {
    char control[256], data[256], line[600];
    mskv_result r;
    size_t need;
    if (!u || !buf) return MSKV_ERROR_NULL_POINTER;
    if (u->broken) return mskv__ucx_err(u, MSKV_ERROR_BAD_STATE, "ucx_lanes: the connection is closed");
    if (!u->ep) return mskv__ucx_err(u, MSKV_ERROR_BAD_STATE, "ucx_lanes: not connected (mskv_ucx_accept or a connect first)");
    r = mskv__ucx_ep_lanes(u, u->ep, control, sizeof control);
    if (r == MSKV_SUCCESS && u->lanes == 2) r = mskv__ucx_data_ep(u);   /* a failure here leaves the connection as it is */
    if (r == MSKV_SUCCESS && u->data_lane == 2) r = mskv__ucx_ep_lanes(u, u->data_ep, data, sizeof data);
    if (r != MSKV_SUCCESS) return r;
    if (u->data_lane == 2) snprintf(line, sizeof line, "control %s; data %s", control, data);
    else snprintf(line, sizeof line, "control %s; data %s (one endpoint%s)", control, control, u->lanes == 2 ? ": no shared memory to the peer" : "");
    need = strlen(line) + 1;
    if (need > cap) return mskv__ucx_err(u, MSKV_ERROR_CAPACITY, "ucx_lanes: cap %zu is too small for \"%s\" (%zu bytes)", cap, line, need);
    memcpy(buf, line, need);
    return MSKV_SUCCESS;
}

/* // >>protocol -----------------------------------------------------------------
   Four kinds of message, told apart by the tag's top byte (the rest is the
   message number): the sender's OFFER (protocol header, the blob header,
   its size, range count and checksum), the receiver's ANSWER (0 = ready,
   else the mskv_result that refused it), the pages as DATA messages of
   whole ranges each (before all that, once per connection, the receiver's
   CHALLENGE: magic, version, 16 random bytes), the sender's DIGEST after
   the last page, the receiver's PREPARED (0 = imported, verified and
   held frozen, else why not), the sender's COMMIT and the receiver's ACK
   (both status 0). Every page message must arrive with exactly its
   offered length.
   The pages' order: with P = pools per entry (2 * layers) and E = ranges
   / P entries (pages of all groups in turn), position j = p * E + e holds
   range e * P + p (entry e of pool p), and message m positions
   [m * per, (m + 1) * per): so a message is a run of consecutive pages
   of one pool (two pools' where it crosses one's end), which each side
   gathers or scatters with one iov entry per piece adjacent in its own
   memory. The sender hashes each message (XXH64, seed 0, over its bytes
   in that order) as it posts it, the receiver each as it lands; the DIGEST
   carries the sender's, so no pass over the blob waits for the transfer
   or the transfer for one. Little-endian fields:
     OFFER  0 u32 magic  4 u32 version  8 u64 header bytes  16 u64 blob bytes
            24 u64 ranges  32 u64 range bytes  40 u64 0
            48 u64 ranges per message  56 u64 counter (1, 2, ...: each offer's
            exceeds the last one accepted on the connection)
            64 32 bytes HMAC-SHA-256 under the secret over bytes 0..63, the
               challenge's 16 random bytes and the blob header (zero without
               a secret)  96 u64 pools per entry P  104 24 bytes 0
            128 the blob header
     DIGEST 0 u32 magic  4 u32 version  8 u64 messages M  16 u64 XXH64 of the
            blob header  24 M u64 XXH64 of message 0, 1, ...  then 32 bytes
            HMAC-SHA-256 under the secret over the offer's bytes 0..63, the
            challenge's random bytes and this message before the MAC (zero
            without a secret: pages and hashes cannot be replaced together)
     ANSWER, PREPARED, COMMIT, ACK  0 u32 magic  4 i32 status */

/* What both sides know about a transfer once the offer is through. */
typedef struct mskv__ucx_xfer {
    mskv_blob_layout layout;
    int64_t per_msg, messages;
    int64_t pools, entries;     /* the pages' order (see above): P and E */
    uint64_t *sums;             /* each message's XXH64 (this side's, as it posted or received it) */
    unsigned char *digest;      /* the DIGEST message (sender: to send; receiver: as it arrived) */
    size_t digest_bytes;
    unsigned char offer64[64];  /* the offer's bytes 0..63 (the DIGEST's MAC covers them) */
    mskv_arena *arena;
    mskv_request req;
    unsigned char *staged;      /* the whole blob in host memory (a store_ops arena), else NULL */
    mskv_blob_range *rg;        /* scratch: one message's ranges */
} mskv__ucx_xfer;


/* Message m's gather/scatter list in op->iov (op->niov entries); sets
   *bytes. Its ranges in the order above; ranges that follow each other in
   this side's memory share an entry, so a run of one pool's adjacent pages
   is one entry. */
static mskv_result mskv__ucx_message(mskv_ucx *u, mskv__ucx_xfer *x, int64_t m, mskv__ucx_op *op, size_t *bytes) {
    int64_t j = m * x->per_msg, n = x->layout.range_count - j < x->per_msg ? x->layout.range_count - j : x->per_msg, k, got = 0;
    size_t rb = x->layout.range_bytes;
    int c = 0;
    mskv_result r;
    *bytes = (size_t)n * rb;
    while (got < n) {
        /* one pool's run: entries e .. e + t of pool p */
        int64_t p = j / x->entries, e = j % x->entries, t = x->entries - e < n - got ? x->entries - e : n - got;
        if (x->staged) {
            for (k = 0; k < t; k++) {
                x->rg[got + k].data = x->staged + x->layout.header_bytes + (size_t)((e + k) * x->pools + p) * rb;
                x->rg[got + k].bytes = rb;
            }
        } else {
            r = mskv__blob_ranges_strided(x->arena, x->req, e * x->pools + p, x->pools, t, x->rg + got);
            if (r != MSKV_SUCCESS) return mskv__ucx_err(u, r, "ucx: the ranges of message %lld", (long long)m);
        }
        got += t;
        j += t;
    }
    for (k = 0; k < n; k++) {
        if (c > 0 && (unsigned char *)op->iov[c - 1].buffer + op->iov[c - 1].length == (unsigned char *)x->rg[k].data) {
            op->iov[c - 1].length += x->rg[k].bytes;
            continue;
        }
        op->iov[c].buffer = x->rg[k].data;
        op->iov[c].length = x->rg[k].bytes;
        c++;
    }
    op->niov = c;
    return MSKV_SUCCESS;
}

/* XXH64 of the message in op (its bytes in order). */
static uint64_t mskv__ucx_sum(const mskv__ucx_op *op) {
    mskv__xxh h;
    int i;
    mskv__xxh_init(&h, 0);
    for (i = 0; i < op->niov; i++) mskv__xxh_update(&h, op->iov[i].buffer, op->iov[i].length);
    return mskv__xxh_digest(&h);
}

/* Posts message m as a send or a receive. */
static mskv_result mskv__ucx_post(mskv_ucx *u, mskv__ucx_xfer *x, int64_t m, mskv__ucx_op *op, int recv) {
    size_t bytes = 0;
    mskv_result r = mskv__ucx_message(u, x, m, op, &bytes);
    int c = op->niov;
    mskv_ucp_tag tag = MSKV__UCX_TAG(MSKV__UCX_DATA, m);
    if (r != MSKV_SUCCESS) return r;
    op->message = m;
    if (!recv && u->desc.hook && u->desc.hook(u->desc.hook_user, MSKV_UCX_HOOK_POSTING, m, op->iov[0].buffer, op->iov[0].length) == MSKV_UCX_HOOK_EMPTY) {
        mskv__ucx_send_op(u, op, tag, op->iov[0].buffer, 0, MSKV_UCP_DATATYPE_CONTIG_BYTE);   /* tests: a lying sender */
        return MSKV_SUCCESS;
    }
    /* one contiguous piece goes as bytes: UCX's fastest path */
    if (recv) {
        if (c == 1) mskv__ucx_recv_op(u, op, tag, op->iov[0].buffer, bytes, MSKV_UCP_DATATYPE_CONTIG_BYTE);
        else mskv__ucx_recv_op(u, op, tag, op->iov, (size_t)c, MSKV_UCP_DATATYPE_IOV);
    } else {
        if (c == 1) mskv__ucx_send_op(u, op, tag, op->iov[0].buffer, bytes, MSKV_UCP_DATATYPE_CONTIG_BYTE);
        else mskv__ucx_send_op(u, op, tag, op->iov, (size_t)c, MSKV_UCP_DATATYPE_IOV);
    }
    return MSKV_SUCCESS;
}

static int mskv__ucx_hook(mskv_ucx *u, mskv_ucx_hook_point at, int64_t m, const mskv__ucx_op *op) {
    if (!u->desc.hook) return 0;
    return u->desc.hook(u->desc.hook_user, at, m, op->iov[0].buffer, op->iov[0].length);
}

/* The test hook at a hand-over step (it may stop or kill this process there). */
static void mskv__ucx_step(mskv_ucx *u, int step) {
    if (u->desc.hook) (void)u->desc.hook(u->desc.hook_user, MSKV_UCX_HOOK_STEP, step, NULL, 0);
}

/* Streams every DATA message through a window of MSKV__UCX_WINDOW ops,
   each completion counting as progress. */
static mskv_result mskv__ucx_pages(mskv_ucx *u, mskv__ucx_xfer *x, int recv) {
    int64_t next = 0, done = 0;
    mskv__ucx_op *win = u->ops;   /* ops[0 .. WINDOW) */
    mskv_result r = MSKV_SUCCESS;
    int i;
    while (r == MSKV_SUCCESS && done < x->messages) {
        for (i = 0; r == MSKV_SUCCESS && i < MSKV__UCX_WINDOW && next < x->messages; i++) {
            if (win[i].busy) continue;
            r = mskv__ucx_post(u, x, next, &win[i], recv);
            if (r == MSKV_SUCCESS && !recv && mskv__ucx_hook(u, MSKV_UCX_HOOK_SENT, next, &win[i]) == MSKV_UCX_HOOK_DROP)
                r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: send: the connection was dropped (test hook) after message %lld", (long long)next);
            /* hashed while it (and the ones before it) are on their way: the request is frozen */
            if (r == MSKV_SUCCESS && !recv) x->sums[next] = mskv__ucx_sum(&win[i]);
            next++;
        }
        if (r != MSKV_SUCCESS) break;
        /* the oldest in-flight message completes first (sends keep order; receives are posted in order) */
        for (i = 0; i < MSKV__UCX_WINDOW; i++)
            if (win[i].busy && win[i].message == done) break;
        r = mskv__ucx_complete(u, &win[i], recv ? "receiving pages" : "sending pages");
        if (r == MSKV_SUCCESS && recv &&
            win[i].info.length != (size_t)(done + 1 < x->messages ? x->per_msg : x->layout.range_count - done * x->per_msg) * x->layout.range_bytes)
            r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: message %lld has %zu bytes, not the offered size", (long long)done, win[i].info.length);
        if (r == MSKV_SUCCESS && recv && mskv__ucx_hook(u, MSKV_UCX_HOOK_RECEIVED, done, &win[i]) == MSKV_UCX_HOOK_DROP)
            r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: receive: the connection was dropped (test hook) after message %lld", (long long)done);
        /* hashed while the later messages land; compared with the DIGEST's when it comes */
        if (r == MSKV_SUCCESS && recv) x->sums[done] = mskv__ucx_sum(&win[i]);
        done++;
    }
    return r;
}

/* A 4-byte status message (ANSWER or DONE) and its wait. */
static mskv_result mskv__ucx_send_status(mskv_ucx *u, int kind, int32_t status, const char *what) {
    unsigned char b[8];
    mskv__ucx_op *op = &u->ops[MSKV__UCX_WINDOW];
    if (u->desc.hook && u->desc.hook(u->desc.hook_user, MSKV_UCX_HOOK_CONTROL, kind, NULL, 0) == MSKV_UCX_HOOK_DROP)
        return MSKV_SUCCESS;   /* tests: the message is lost on its way */
    mskv__ucx_put32(b, MSKV__UCX_MAGIC);
    mskv__ucx_put32(b + 4, (uint32_t)status);
    mskv__ucx_send_op(u, op, MSKV__UCX_TAG(kind, 0), b, sizeof b, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    return mskv__ucx_complete(u, op, what);
}

/* Receives a status message into *status. */
static mskv_result mskv__ucx_recv_status(mskv_ucx *u, mskv__ucx_op *op, unsigned char *b, int kind, int32_t *status, const char *what) {
    mskv_result r;
    if (!op->busy) mskv__ucx_recv_op(u, op, MSKV__UCX_TAG(kind, 0), b, 8, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    r = mskv__ucx_complete(u, op, what);
    if (r != MSKV_SUCCESS) return r;
    if (op->info.length != 8 || mskv__ucx_get32(b) != MSKV__UCX_MAGIC)
        return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx: %s: not this protocol's message", what);
    *status = (int32_t)mskv__ucx_get32(b + 4);
    return MSKV_SUCCESS;
}

static int64_t mskv__ucx_ranges_per_msg(const mskv_ucx *u, size_t range_bytes) {
    int64_t n = range_bytes ? (int64_t)(u->desc.message_bytes / range_bytes) : 1;
    if (n < 1) n = 1;
    if (n > MSKV__UCX_MAX_RANGES) n = MSKV__UCX_MAX_RANGES;
    return n;
}

/* // >>sender -------------------------------------------------------------------- */

/* The sender's blob: streamed from the pools (export_begin freezes the
   request), or staged in one host copy when its pages live behind
   store_ops. The offer's blob header is written at offer + 64. */
static mskv_result mskv__ucx_export(mskv_ucx *u, mskv__ucx_xfer *x, unsigned char *offer) {
    mskv_store_info si;
    size_t size = 0;
    /* no pass over the bytes first: each message is hashed as it goes out */
    mskv_result r = mskv__export_begin(x->arena, x->req, offer + MSKV__UCX_OFFER_FIXED, MSKV_BLOB_HEADER_MAX, &x->layout, 0);
    if (r == MSKV_SUCCESS) r = mskv_store_info_get(x->arena, &si);
    if (r == MSKV_SUCCESS) {
        x->pools = 2 * (int64_t)si.num_layers;
        return MSKV_SUCCESS;
    }
    if (r != MSKV_ERROR_UNSUPPORTED) return r;
    r = mskv_store_info_get(x->arena, &si);
    if (r == MSKV_SUCCESS) r = mskv_request_export(x->arena, x->req, NULL, 0, &size);
    if (r != MSKV_SUCCESS) return r;
    x->staged = (unsigned char *)mskv__alloc(&u->al, size);
    if (!x->staged) return mskv__ucx_err(u, MSKV_ERROR_OUT_OF_MEMORY, "ucx_send: %zu bytes to stage the blob", size);
    r = mskv_request_export(x->arena, x->req, x->staged, size, &size);
    if (r != MSKV_SUCCESS) return r;
    x->layout.header_bytes = (size_t)mskv__ucx_get32(x->staged + 12);
    x->layout.blob_bytes = size;
    x->layout.range_bytes = si.page_bytes;
    x->layout.range_count = si.page_bytes ? (int64_t)((size - x->layout.header_bytes - 8) / si.page_bytes) : 0;
    x->layout.checksum = 0;
    x->pools = 2 * (int64_t)si.num_layers;
    memcpy(offer + MSKV__UCX_OFFER_FIXED, x->staged, x->layout.header_bytes);
    return MSKV_SUCCESS;
}

static void mskv__ucx_offer_write(unsigned char *b, const mskv__ucx_xfer *x) {
    memset(b, 0, MSKV__UCX_OFFER_FIXED);
    mskv__ucx_put32(b, MSKV__UCX_MAGIC);
    mskv__ucx_put32(b + 4, MSKV__UCX_PROTOCOL);
    mskv__ucx_put64(b + 8, (uint64_t)x->layout.header_bytes);
    mskv__ucx_put64(b + 16, (uint64_t)x->layout.blob_bytes);
    mskv__ucx_put64(b + 24, (uint64_t)x->layout.range_count);
    mskv__ucx_put64(b + 32, (uint64_t)x->layout.range_bytes);
    mskv__ucx_put64(b + 48, (uint64_t)x->per_msg);
    mskv__ucx_put64(b + 96, (uint64_t)x->pools);
}

/* The order of the pages and the per-message hashes' room, from the
   layout, per_msg and pools (checked by the caller). */
static mskv_result mskv__ucx_plan(mskv_ucx *u, mskv__ucx_xfer *x) {
    x->messages = (x->layout.range_count + x->per_msg - 1) / x->per_msg;
    x->entries = x->pools ? x->layout.range_count / x->pools : 0;
    x->digest_bytes = 24 + 8 * (size_t)x->messages + 32;
    x->sums = (uint64_t *)mskv__alloc(&u->al, sizeof(uint64_t) * (size_t)(x->messages + 1));
    x->digest = (unsigned char *)mskv__alloc(&u->al, x->digest_bytes);
    x->rg = (mskv_blob_range *)mskv__alloc(&u->al, sizeof(mskv_blob_range) * (size_t)x->per_msg);
    if (!x->sums || !x->digest || !x->rg) return mskv__ucx_err(u, MSKV_ERROR_OUT_OF_MEMORY, "ucx: %zu bytes of message hashes", x->digest_bytes);
    return MSKV_SUCCESS;
}

static void mskv__ucx_unplan(mskv_ucx *u, mskv__ucx_xfer *x) {
    mskv__free(&u->al, x->sums);
    mskv__free(&u->al, x->digest);
    mskv__free(&u->al, x->rg);
    mskv__free(&u->al, x->staged);
    x->sums = NULL;
    x->digest = NULL;
    x->rg = NULL;
    x->staged = NULL;
}

/* The DIGEST's MAC (see the protocol above). */
static void mskv__ucx_digest_mac(const mskv_ucx *u, const mskv__ucx_xfer *x, unsigned char mac[32]) {
    mskv__hmac3(u->k0, x->offer64, 64, u->challenge + 8, 16, x->digest, x->digest_bytes - 32, mac);
}

/* The sender's DIGEST: the header's hash and each message's, as posted. */
static void mskv__ucx_digest_write(const mskv_ucx *u, mskv__ucx_xfer *x, const unsigned char *header) {
    int64_t m;
    mskv__ucx_put32(x->digest, MSKV__UCX_MAGIC);
    mskv__ucx_put32(x->digest + 4, MSKV__UCX_PROTOCOL);
    mskv__ucx_put64(x->digest + 8, (uint64_t)x->messages);
    mskv__ucx_put64(x->digest + 16, mskv_xxh64(header, x->layout.header_bytes, 0));
    for (m = 0; m < x->messages; m++) mskv__ucx_put64(x->digest + 24 + 8 * m, x->sums[m]);
    memset(x->digest + x->digest_bytes - 32, 0, 32);
    if (u->authed) mskv__ucx_digest_mac(u, x, x->digest + x->digest_bytes - 32);
}

/* The receiver's check of the DIGEST against what landed: BLOB_CORRUPT
   naming the first message (or the header) whose bytes differ. */
static mskv_result mskv__ucx_digest_check(mskv_ucx *u, mskv__ucx_xfer *x, const unsigned char *header) {
    int64_t m;
    if (mskv__ucx_get32(x->digest) != MSKV__UCX_MAGIC || mskv__ucx_get32(x->digest + 4) != MSKV__UCX_PROTOCOL ||
        mskv__ucx_get64(x->digest + 8) != (uint64_t)x->messages)
        return mskv__ucx_err(u, MSKV_ERROR_BLOB_CORRUPT, "ucx_recv: the DIGEST is not this protocol's or not for %lld messages", (long long)x->messages);
    if (u->authed) {
        unsigned char mac[32];
        mskv__ucx_digest_mac(u, x, mac);
        if (!mskv__mac_equal(mac, x->digest + x->digest_bytes - 32))
            return mskv__ucx_err(u, MSKV_ERROR_BLOB_CORRUPT, "ucx_recv: the DIGEST's HMAC-SHA-256 does not match (its hashes were changed)");
    }
    if (mskv__ucx_get64(x->digest + 16) != mskv_xxh64(header, x->layout.header_bytes, 0))
        return mskv__ucx_err(u, MSKV_ERROR_BLOB_CORRUPT, "ucx_recv: the blob header's XXH64 differs from the sender's");
    for (m = 0; m < x->messages; m++)
        if (mskv__ucx_get64(x->digest + 24 + 8 * m) != x->sums[m])
            return mskv__ucx_err(u, MSKV_ERROR_BLOB_CORRUPT, "ucx_recv: message %lld of %lld arrived changed (its XXH64 %016llx, the sender's %016llx)",
                                 (long long)m, (long long)x->messages, (unsigned long long)x->sums[m],
                                 (unsigned long long)mskv__ucx_get64(x->digest + 24 + 8 * m));
    return MSKV_SUCCESS;
}

/* The offer's MAC (fixed part's first 64 bytes, the challenge, the blob header). */
static void mskv__ucx_offer_mac(const mskv_ucx *u, const unsigned char *b, size_t header_bytes, unsigned char mac[32]) {
    mskv__hmac3(u->k0, b, 64, u->challenge + 8, 16, b + MSKV__UCX_OFFER_FIXED, header_bytes, mac);
}

/* A status the peer sent: a library code, or PEER for anything else. */
static mskv_result mskv__ucx_peer_code(int32_t status) {
    return status < 0 && status > -128 ? (mskv_result)status : MSKV_ERROR_PEER;
}

/* Offer, answer, pages, PREPARED, COMMIT, ACK; the request stays frozen
   throughout. *decided is set once COMMIT may have left: from then on a
   failure leaves the outcome unknown here. */
static mskv_result mskv__ucx_send_steps(mskv_ucx *u, mskv__ucx_xfer *x, unsigned char *offer, int *decided) {
    mskv__ucx_op *op = &u->ops[MSKV__UCX_WINDOW], *st = &u->ops[MSKV__UCX_WINDOW + 1];
    unsigned char sb[8];
    int32_t status = 0;
    mskv_result r = MSKV_SUCCESS;
    /* the answer's receive goes first, so it never waits in UCX's unexpected queue */
    mskv__ucx_recv_op(u, st, MSKV__UCX_TAG(MSKV__UCX_ANSWER, 0), sb, sizeof sb, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    if (!(u->desc.hook && u->desc.hook(u->desc.hook_user, MSKV_UCX_HOOK_CONTROL, MSKV__UCX_OFFER, offer,
                                       MSKV__UCX_OFFER_FIXED + x->layout.header_bytes) == MSKV_UCX_HOOK_DROP)) {
        mskv__ucx_send_op(u, op, MSKV__UCX_TAG(MSKV__UCX_OFFER, 0), offer, MSKV__UCX_OFFER_FIXED + x->layout.header_bytes,
                          MSKV_UCP_DATATYPE_CONTIG_BYTE);
        r = mskv__ucx_complete(u, op, "sending the offer");
    }
    if (r == MSKV_SUCCESS) mskv__ucx_step(u, MSKV_UCX_STEP_OFFER_SENT);
    if (r == MSKV_SUCCESS) r = mskv__ucx_recv_status(u, st, sb, MSKV__UCX_ANSWER, &status, "waiting for the answer");
    if (r != MSKV_SUCCESS) return r;
    mskv__ucx_step(u, MSKV_UCX_STEP_ANSWER_RECEIVED);
    if (status != 0) {
        r = mskv__ucx_peer_code(status);
        return mskv__ucx_err(u, r, "ucx_send: the receiver refused the request: %s", mskv_result_string(r));
    }
    mskv__ucx_recv_op(u, st, MSKV__UCX_TAG(MSKV__UCX_DONE, 0), sb, sizeof sb, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    r = mskv__ucx_pages(u, x, 0);
    if (r == MSKV_SUCCESS) {
        mskv__ucx_digest_write(u, x, offer + MSKV__UCX_OFFER_FIXED);
        if (!(u->desc.hook && u->desc.hook(u->desc.hook_user, MSKV_UCX_HOOK_CONTROL, MSKV__UCX_DIGEST, x->digest, x->digest_bytes) == MSKV_UCX_HOOK_DROP)) {
            mskv__ucx_send_op(u, op, MSKV__UCX_TAG(MSKV__UCX_DIGEST, 0), x->digest, x->digest_bytes, MSKV_UCP_DATATYPE_CONTIG_BYTE);
            r = mskv__ucx_complete(u, op, "sending the DIGEST");
        }
    }
    if (r == MSKV_SUCCESS) mskv__ucx_step(u, MSKV_UCX_STEP_PAGES_SENT);
    if (r == MSKV_SUCCESS) r = mskv__ucx_recv_status(u, st, sb, MSKV__UCX_DONE, &status, "waiting for PREPARED");
    if (r != MSKV_SUCCESS) return r;
    if (status != 0) {
        r = mskv__ucx_peer_code(status);
        return mskv__ucx_err(u, r, "ucx_send: the receiver did not import the request: %s", mskv_result_string(r));
    }
    mskv__ucx_step(u, MSKV_UCX_STEP_PREPARED_RECEIVED);
    /* the decision: the receiver holds a verified frozen copy, ours stays frozen until its ACK */
    mskv__ucx_recv_op(u, st, MSKV__UCX_TAG(MSKV__UCX_ACK, 0), sb, sizeof sb, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    *decided = 1;
    r = mskv__ucx_send_status(u, MSKV__UCX_COMMIT, 0, "sending COMMIT");
    if (r == MSKV_SUCCESS) mskv__ucx_step(u, MSKV_UCX_STEP_COMMIT_SENT);
    if (r == MSKV_SUCCESS) r = mskv__ucx_recv_status(u, st, sb, MSKV__UCX_ACK, &status, "waiting for the ACK");
    if (r == MSKV_SUCCESS && status != 0) r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_send: an ACK with status %d", (int)status);
    if (r == MSKV_SUCCESS) mskv__ucx_step(u, MSKV_UCX_STEP_ACK_RECEIVED);
    return r;
}

MSKV_IMPL mskv_result mskv_ucx_send(mskv_ucx *u, mskv_arena *arena, mskv_request req, uint32_t flags) {
    unsigned char offer[MSKV__UCX_OFFER_MAX];
    mskv__ucx_xfer x;
    mskv_result r, e;
    int decided = 0;
    if (!u || !arena) return MSKV_ERROR_NULL_POINTER;
    if (u->doubt) return mskv__ucx_err(u, MSKV_ERROR_BAD_STATE, "ucx_send: a hand-over is in doubt (mskv_ucx_resolve first)");
    if (u->broken) return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_send: the connection is closed");
    if (!u->ep) return mskv__ucx_err(u, MSKV_ERROR_BAD_STATE, "ucx_send: not connected (mskv_ucx_accept first)");
    memset(&x, 0, sizeof x);
    x.arena = arena;
    x.req = req;
    if (!u->have_challenge) {
        mskv__ucx_op *ch = &u->ops[MSKV__UCX_WINDOW + 2];
        r = ch->busy ? mskv__ucx_complete(u, ch, "waiting for the receiver's challenge")
                     : mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_send: no challenge is on its way");
        if (r == MSKV_SUCCESS && (ch->info.length != sizeof u->challenge || mskv__ucx_get32(u->challenge) != MSKV__UCX_MAGIC ||
                                  mskv__ucx_get32(u->challenge + 4) != MSKV__UCX_PROTOCOL))
            r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_send: the receiver's challenge is not this protocol's (version %u)", (unsigned)MSKV__UCX_PROTOCOL);
        if (r != MSKV_SUCCESS) {
            if (r != MSKV_ERROR_TIMEOUT || u->failed) mskv__ucx_break(u);
            return r;
        }
        u->have_challenge = 1;
    }
    r = mskv__ucx_export(u, &x, offer);
    if (r == MSKV_SUCCESS) {
        x.per_msg = mskv__ucx_ranges_per_msg(u, x.layout.range_bytes);
        r = mskv__ucx_plan(u, &x);
        mskv__ucx_offer_write(offer, &x);
        mskv__ucx_put64(offer + 56, ++u->offers_sent);
        memcpy(x.offer64, offer, 64);
        if (u->authed) mskv__ucx_offer_mac(u, offer, x.layout.header_bytes, offer + 64);
        if (r == MSKV_SUCCESS) {
            r = mskv__ucx_send_steps(u, &x, offer, &decided);
            /* a refusal or a failed import ends the exchange in step; anything else leaves it unknown */
            /* DENIED: the receiver ends the connection */
            if (r == MSKV_ERROR_PEER || r == MSKV_ERROR_TIMEOUT || r == MSKV_ERROR_DENIED || mskv__ucx_any_busy(u) || (decided && r != MSKV_SUCCESS))
                mskv__ucx_break(u);
        }
        if (decided && r != MSKV_SUCCESS) {
            /* COMMIT may have arrived: the receiver may hold the request now, or may not. Ours stays frozen. */
            u->doubt = 1;
            u->doubt_arena = arena;
            u->doubt_req = req;
            u->doubt_flags = flags;
            u->doubt_frozen = !x.staged;
            mskv__ucx_unplan(u, &x);
            return mskv__ucx_err(u, MSKV_ERROR_IN_DOUBT, "ucx_send: COMMIT sent, no ACK (%s): the request stays frozen until mskv_ucx_resolve",
                                 mskv_result_string(r));
        }
        if (!x.staged) {
            /* the arena refuses every call that would end the export under us
               (arena_reset included); should it end anyway, say so, never assert */
            e = mskv_request_export_end(arena, req);
            if (e != MSKV_SUCCESS) {
                mskv__ucx_err(u, e, "ucx_send: ending the export failed (%s): the request is not ours to remove", mskv_result_string(e));
                if (r == MSKV_SUCCESS) r = e;
                flags |= MSKV_UCX_KEEP;
            }
        }
    }
    mskv__ucx_unplan(u, &x);
    if (r == MSKV_SUCCESS && !(flags & MSKV_UCX_KEEP)) {
        /* acknowledged: the receiver holds a verified usable copy, ours may go */
        r = mskv_request_remove(arena, req);
        if (r != MSKV_SUCCESS) mskv__ucx_err(u, r, "ucx_send: the receiver has the request, removing ours failed");
    }
    return r;
}

/* // >>receiver ------------------------------------------------------------------ */

/* Reads an offer into x: the layout it announces, checked for sense. */
static mskv_result mskv__ucx_offer_read(mskv_ucx *u, const unsigned char *b, size_t len, mskv__ucx_xfer *x) {
    uint64_t hb, bb, rc, rb, pm, want, pools;
    uint64_t counter;
    if (len < MSKV__UCX_OFFER_FIXED || mskv__ucx_get32(b) != MSKV__UCX_MAGIC || mskv__ucx_get32(b + 4) != MSKV__UCX_PROTOCOL)
        return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_recv: the offer is not this protocol's (version %u)", (unsigned)MSKV__UCX_PROTOCOL);
    if (u->authed) {
        /* before anything in it is believed: its header bytes are what the MAC covers */
        unsigned char mac[32];
        mskv__ucx_offer_mac(u, b, len - MSKV__UCX_OFFER_FIXED, mac);
        if (!mskv__mac_equal(mac, b + 64))
            return mskv__ucx_err(u, MSKV_ERROR_DENIED, "ucx_recv: the offer's HMAC-SHA-256 does not match (no secret, another secret, or changed bytes)");
    }
    counter = mskv__ucx_get64(b + 56);
    if (counter <= u->last_counter)
        return mskv__ucx_err(u, MSKV_ERROR_DENIED, "ucx_recv: offer counter %llu is not past %llu: a replayed offer", (unsigned long long)counter,
                             (unsigned long long)u->last_counter);
    hb = mskv__ucx_get64(b + 8);
    bb = mskv__ucx_get64(b + 16);
    rc = mskv__ucx_get64(b + 24);
    rb = mskv__ucx_get64(b + 32);
    pm = mskv__ucx_get64(b + 48);
    pools = mskv__ucx_get64(b + 96);
    want = hb + 8;
    if (hb > MSKV_BLOB_HEADER_MAX || len != MSKV__UCX_OFFER_FIXED + hb || pm < 1 || pm > MSKV__UCX_MAX_RANGES ||
        rc > ((uint64_t)1 << 40) || (rb != 0 && rc > (((uint64_t)-1 >> 1) - want) / rb) || want + rc * rb != bb ||
        bb > (uint64_t)(size_t)-1 || pools < 1 || pools > (uint64_t)INT32_MAX || rc % pools != 0)
        return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_recv: the offer's sizes do not add up");
    x->layout.header_bytes = (size_t)hb;
    x->layout.blob_bytes = (size_t)bb;
    x->layout.range_count = (int64_t)rc;
    x->layout.range_bytes = (size_t)rb;
    x->layout.checksum = 0;
    x->per_msg = (int64_t)pm;
    x->pools = (int64_t)pools;
    x->messages = (x->layout.range_count + x->per_msg - 1) / x->per_msg;
    memcpy(x->offer64, b, 64);
    u->last_counter = counter;
    return MSKV_SUCCESS;
}

/* Where the pages go: a streamed import (pages admitted now, all or
   nothing), or a host copy of the blob when the pages live behind store_ops. */
static mskv_result mskv__ucx_import(mskv_ucx *u, mskv__ucx_xfer *x, const unsigned char *header) {
    mskv_blob_layout got;
    mskv_result r = mskv_request_import_begin(x->arena, header, x->layout.header_bytes, &x->req, &got);
    if (r == MSKV_SUCCESS) {
        if (got.blob_bytes != x->layout.blob_bytes || got.range_count != x->layout.range_count || got.range_bytes != x->layout.range_bytes) {
            mskv_request_import_abort(x->arena, x->req);
            return mskv__ucx_err(u, MSKV_ERROR_BLOB_CORRUPT, "ucx_recv: the offer's sizes differ from its blob header's");
        }
        r = mskv__ucx_plan(u, x);
        if (r != MSKV_SUCCESS) mskv_request_import_abort(x->arena, x->req);
        return r;
    }
    if (r != MSKV_ERROR_UNSUPPORTED) return r;
    x->staged = (unsigned char *)mskv__alloc(&u->al, x->layout.blob_bytes);
    if (!x->staged) return mskv__ucx_err(u, MSKV_ERROR_OUT_OF_MEMORY, "ucx_recv: %zu bytes to stage the blob", x->layout.blob_bytes);
    memcpy(x->staged, header, x->layout.header_bytes);
    return mskv__ucx_plan(u, x);
}

/* Verifies what arrived (each message's hash against the DIGEST's) and
   makes the request exist, or leaves nothing. */
static mskv_result mskv__ucx_import_commit(mskv_ucx *u, mskv__ucx_xfer *x, const unsigned char *header) {
    mskv_result r = mskv__ucx_digest_check(u, x, header);
    if (!x->staged) {
        /* every byte is checked: import_commit's other checks, not its pass over the bytes */
        if (r == MSKV_SUCCESS) r = mskv__import_commit(x->arena, x->req, 0, 1);
        if (r != MSKV_SUCCESS) mskv_request_import_abort(x->arena, x->req);
        return r;
    }
    if (r != MSKV_SUCCESS) return r;
    /* the staged blob's own checksum, which mskv_request_import checks again (store_ops: the slow path) */
    mskv__ucx_put64(x->staged + x->layout.blob_bytes - 8, mskv__blob_checksum(x->staged, x->layout.blob_bytes - 8));
    r = mskv_request_import(x->arena, x->staged, x->layout.blob_bytes, &x->req);
    if (r == MSKV_SUCCESS) {
        r = mskv_request_reload(x->arena, x->req);
        if (r != MSKV_SUCCESS) mskv_request_remove(x->arena, x->req);
    }
    (void)u;
    return r;
}

/* Drops whatever the receiver holds of an unfinished import. */
static void mskv__ucx_import_drop(mskv__ucx_xfer *x) {
    if (!x->staged) mskv_request_import_abort(x->arena, x->req);
}

/* Holds a verified import frozen (host pools: an open export) until COMMIT. */
static mskv_result mskv__ucx_freeze(mskv_ucx *u, mskv__ucx_xfer *x) {
    unsigned char hdr[MSKV_BLOB_HEADER_MAX];
    mskv_blob_layout lay;
    mskv_result r;
    if (x->staged) return MSKV_SUCCESS;   /* store_ops: frozen by contract (the handle is not given out) */
    r = mskv__export_begin(x->arena, x->req, hdr, sizeof hdr, &lay, 0);   /* frozen only: no checksum wanted */
    if (r != MSKV_SUCCESS) {
        mskv_request_remove(x->arena, x->req);
        return mskv__ucx_err(u, r, "ucx_recv: freezing the imported request failed: %s", mskv_result_string(r));
    }
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_ucx_recv(mskv_ucx *u, mskv_arena *arena, mskv_request *out) {
    unsigned char offer[MSKV__UCX_OFFER_MAX], cb[8];
    mskv__ucx_op *op, *cop;
    mskv__ucx_xfer x;
    mskv_result r, s;
    int32_t status = 0;
    if (!u || !arena || !out) return MSKV_ERROR_NULL_POINTER;
    if (u->doubt) return mskv__ucx_err(u, MSKV_ERROR_BAD_STATE, "ucx_recv: a hand-over is in doubt (mskv_ucx_resolve first)");
    if (u->broken) return mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_recv: the connection is closed");
    if (!u->ep) return mskv__ucx_err(u, MSKV_ERROR_BAD_STATE, "ucx_recv: not connected (mskv_ucx_accept first)");
    op = &u->ops[MSKV__UCX_WINDOW];
    cop = &u->ops[MSKV__UCX_WINDOW + 1];
    memset(&x, 0, sizeof x);
    x.arena = arena;
    mskv__ucx_recv_op(u, op, MSKV__UCX_TAG(MSKV__UCX_OFFER, 0), offer, sizeof offer, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    r = mskv__ucx_complete(u, op, "waiting for an offer");
    if (r == MSKV_ERROR_TIMEOUT && !u->failed) {
        /* nobody sent anything: the connection is as good as before */
        mskv__ucx_cancel(u, op);
        return r;
    }
    if (r == MSKV_SUCCESS) r = mskv__ucx_offer_read(u, offer, op->info.length, &x);
    if (r == MSKV_ERROR_DENIED) {
        /* not a peer of ours, or a replay: no page was taken; it learns why, and the connection ends */
        if (mskv__ucx_send_status(u, MSKV__UCX_ANSWER, (int32_t)r, "refusing the offer") == MSKV_SUCCESS)
            mskv__ucx_linger(u, u->desc.timeout_ms < 500 ? (int)u->desc.timeout_ms : 500);
        mskv__ucx_break(u);
        return r;
    }
    if (r != MSKV_SUCCESS) { mskv__ucx_break(u); return r; }
    mskv__ucx_step(u, MSKV_UCX_STEP_OFFER_RECEIVED);
    r = mskv__ucx_import(u, &x, offer + MSKV__UCX_OFFER_FIXED);
    if (r != MSKV_SUCCESS) {
        /* refused before any page moved: the sender learns why, the connection stays usable */
        s = mskv__ucx_send_status(u, MSKV__UCX_ANSWER, (int32_t)r, "answering the offer");
        if (s != MSKV_SUCCESS) mskv__ucx_break(u);
        mskv__ucx_unplan(u, &x);
        return r;
    }
    /* the DIGEST's receive goes first, so it never waits in UCX's unexpected queue */
    mskv__ucx_recv_op(u, cop, MSKV__UCX_TAG(MSKV__UCX_DIGEST, 0), x.digest, x.digest_bytes, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    r = mskv__ucx_send_status(u, MSKV__UCX_ANSWER, 0, "answering the offer");
    if (r == MSKV_SUCCESS) mskv__ucx_step(u, MSKV_UCX_STEP_ANSWER_SENT);
    if (r == MSKV_SUCCESS) r = mskv__ucx_pages(u, &x, 1);
    if (r == MSKV_SUCCESS) r = mskv__ucx_complete(u, cop, "waiting for the DIGEST");
    if (r == MSKV_SUCCESS && cop->info.length != x.digest_bytes)
        r = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_recv: a DIGEST of %zu bytes, not %zu", cop->info.length, x.digest_bytes);
    if (r == MSKV_SUCCESS) mskv__ucx_step(u, MSKV_UCX_STEP_PAGES_RECEIVED);
    if (r != MSKV_SUCCESS) {
        mskv__ucx_break(u);
        mskv__ucx_import_drop(&x);
        goto done;
    }
    r = mskv__ucx_import_commit(u, &x, offer + MSKV__UCX_OFFER_FIXED);
    if (r == MSKV_SUCCESS) r = mskv__ucx_freeze(u, &x);
    if (r != MSKV_SUCCESS) {
        /* nothing kept: the sender learns why and keeps its copy */
        s = mskv__ucx_send_status(u, MSKV__UCX_DONE, (int32_t)r, "answering the pages");
        if (s != MSKV_SUCCESS) mskv__ucx_break(u);
        goto done;
    }
    /* PREPARED: from here the decision is the sender's; the COMMIT's receive goes first */
    mskv__ucx_recv_op(u, cop, MSKV__UCX_TAG(MSKV__UCX_COMMIT, 0), cb, sizeof cb, MSKV_UCP_DATATYPE_CONTIG_BYTE);
    s = mskv__ucx_send_status(u, MSKV__UCX_DONE, 0, "sending PREPARED");
    if (s == MSKV_SUCCESS) mskv__ucx_step(u, MSKV_UCX_STEP_PREPARED_SENT);
    if (s == MSKV_SUCCESS) s = mskv__ucx_recv_status(u, cop, cb, MSKV__UCX_COMMIT, &status, "waiting for COMMIT");
    if (s == MSKV_SUCCESS && status != 0) s = mskv__ucx_err(u, MSKV_ERROR_PEER, "ucx_recv: a COMMIT with status %d", (int)status);
    if (s != MSKV_SUCCESS) {
        /* the sender may have decided either way: hold the request frozen until resolved */
        mskv__ucx_break(u);
        u->doubt = 2;
        u->doubt_arena = arena;
        u->doubt_req = x.req;
        u->doubt_flags = 0;
        u->doubt_frozen = !x.staged;
        *out = x.req;
        r = mskv__ucx_err(u, MSKV_ERROR_IN_DOUBT, "ucx_recv: PREPARED sent, no COMMIT (%s): the request stays frozen until mskv_ucx_resolve",
                          mskv_result_string(s));
        goto done;
    }
    mskv__ucx_step(u, MSKV_UCX_STEP_COMMIT_RECEIVED);
    if (!x.staged) {
        r = mskv_request_export_end(arena, x.req);
        if (r != MSKV_SUCCESS) mskv__ucx_err(u, r, "ucx_recv: unfreezing the request failed (it stays frozen)");
    }
    /* committed: the request is ours whether or not the ACK gets through (a sender left without it resolves COMMITTED) */
    s = mskv__ucx_send_status(u, MSKV__UCX_ACK, 0, "sending the ACK");
    if (s != MSKV_SUCCESS) mskv__ucx_break(u);
    else mskv__ucx_step(u, MSKV_UCX_STEP_ACK_SENT);
    *out = x.req;
done:
    mskv__ucx_unplan(u, &x);
    return r;
}

MSKV_IMPL int mskv_ucx_in_doubt(const mskv_ucx *u, mskv_request *req) {
    if (!u) return 0;
    if (req && u->doubt) *req = u->doubt_req;
    return u->doubt;
}

MSKV_IMPL mskv_result mskv_ucx_resolve(mskv_ucx *u, int outcome, mskv_request *out) {
    mskv_result r = MSKV_SUCCESS;
    int drop;
    if (!u) return MSKV_ERROR_NULL_POINTER;
    if (outcome != MSKV_UCX_COMMITTED && outcome != MSKV_UCX_ABORTED)
        return mskv__ucx_err(u, MSKV_ERROR_INVALID_ARGUMENT, "ucx_resolve: outcome %d is neither MSKV_UCX_COMMITTED (%d) nor MSKV_UCX_ABORTED (%d)",
                             outcome, MSKV_UCX_COMMITTED, MSKV_UCX_ABORTED);
    if (!u->doubt) return mskv__ucx_err(u, MSKV_ERROR_BAD_STATE, "ucx_resolve: no hand-over is in doubt");
    if (u->doubt_frozen) {
        r = mskv_request_export_end(u->doubt_arena, u->doubt_req);
        if (r != MSKV_SUCCESS) return mskv__ucx_err(u, r, "ucx_resolve: unfreezing the request: %s", mskv_result_string(r));
        u->doubt_frozen = 0;
    }
    drop = u->doubt == 1 ? outcome == MSKV_UCX_COMMITTED && !(u->doubt_flags & MSKV_UCX_KEEP) : outcome == MSKV_UCX_ABORTED;
    if (drop) {
        r = mskv_request_remove(u->doubt_arena, u->doubt_req);
        if (r != MSKV_SUCCESS) return mskv__ucx_err(u, r, "ucx_resolve: removing the request: %s", mskv_result_string(r));
    }
    if (out && u->doubt == 2 && outcome == MSKV_UCX_COMMITTED) *out = u->doubt_req;
    u->doubt = 0;
    return MSKV_SUCCESS;
}

#ifdef __cplusplus
}
#endif
#endif /* MSTAR_KV_UCX_IMPLEMENTATION_DONE */
#endif /* MSTAR_KV_UCX_IMPLEMENTATION */
