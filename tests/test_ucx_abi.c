/* mstar_kv_ucx.h declares the UCP types and constants it uses itself, so
   that it builds without UCX. This program checks every mirrored struct's
   size and field offsets and every constant against the real headers
   (Debian's libucx-dev), compiled in the same file. Without the headers
   (make builds it without MSKV_HAVE_UCX_HEADERS) it skips, saying why. */
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include "mskv_test.h"
#include <stddef.h>
#include "../mstar_kv_ucx.h"

#ifndef MSKV_HAVE_UCX_HEADERS

TEST(ucx_mirrored_types_match_the_real_headers) {
    SKIP("UCX's development headers (ucp/api/ucp.h, Debian's libucx-dev) are not installed");
}

#else
#include <ucp/api/ucp.h>

#define MTA_SAME(mine, theirs, field) EXPECT_EQ((long)offsetof(mine, field), (long)offsetof(theirs, field))
#define MTA_SAME2(mine, mf, theirs, tf) EXPECT_EQ((long)offsetof(mine, mf), (long)offsetof(theirs, tf))
#define MTA_SIZE(mine, theirs) EXPECT_EQ((long)sizeof(mine), (long)sizeof(theirs))

TEST(ucx_header_version_is_in_the_supported_range) {
    EXPECT_EQ(1, UCP_API_MAJOR);
    EXPECT_GE(UCP_API_MINOR, 12);
}

TEST(ucx_params_mirror_ucp_params_t) {
    MTA_SIZE(mskv_ucp_params, ucp_params_t);
    MTA_SAME(mskv_ucp_params, ucp_params_t, field_mask);
    MTA_SAME(mskv_ucp_params, ucp_params_t, features);
    MTA_SAME(mskv_ucp_params, ucp_params_t, request_size);
    MTA_SAME(mskv_ucp_params, ucp_params_t, tag_sender_mask);
    MTA_SAME(mskv_ucp_params, ucp_params_t, estimated_num_ppn);
    MTA_SAME(mskv_ucp_params, ucp_params_t, name);
}

TEST(ucx_worker_params_mirror_ucp_worker_params_t) {
    MTA_SIZE(mskv_ucp_worker_params, ucp_worker_params_t);
    MTA_SAME(mskv_ucp_worker_params, ucp_worker_params_t, field_mask);
    MTA_SAME(mskv_ucp_worker_params, ucp_worker_params_t, thread_mode);
    MTA_SAME(mskv_ucp_worker_params, ucp_worker_params_t, cpu_mask);
    MTA_SAME(mskv_ucp_worker_params, ucp_worker_params_t, events);
    MTA_SAME(mskv_ucp_worker_params, ucp_worker_params_t, event_fd);
    MTA_SAME(mskv_ucp_worker_params, ucp_worker_params_t, name);
    MTA_SAME(mskv_ucp_worker_params, ucp_worker_params_t, client_id);
    EXPECT_EQ(MSKV_UCS_THREAD_MODE_SINGLE, (int)UCS_THREAD_MODE_SINGLE);
}

TEST(ucx_listener_params_and_attr_mirror_the_real_ones) {
    MTA_SIZE(mskv_ucp_listener_params, ucp_listener_params_t);
    MTA_SAME(mskv_ucp_listener_params, ucp_listener_params_t, sockaddr);
    MTA_SAME(mskv_ucp_listener_params, ucp_listener_params_t, accept_handler);
    MTA_SAME(mskv_ucp_listener_params, ucp_listener_params_t, conn_handler);
    MTA_SAME2(mskv_ucp_listener_params, conn_handler.arg, ucp_listener_params_t, conn_handler.arg);
    MTA_SIZE(mskv_ucp_listener_attr, ucp_listener_attr_t);
    MTA_SAME(mskv_ucp_listener_attr, ucp_listener_attr_t, sockaddr);
    MTA_SIZE(mskv_ucs_sock_addr, ucs_sock_addr_t);
    MTA_SAME(mskv_ucs_sock_addr, ucs_sock_addr_t, addrlen);
}

TEST(ucx_ep_params_mirror_ucp_ep_params_t) {
    MTA_SIZE(mskv_ucp_ep_params, ucp_ep_params_t);
    MTA_SAME(mskv_ucp_ep_params, ucp_ep_params_t, address);
    MTA_SAME(mskv_ucp_ep_params, ucp_ep_params_t, err_mode);
    MTA_SAME(mskv_ucp_ep_params, ucp_ep_params_t, err_handler);
    MTA_SAME2(mskv_ucp_ep_params, err_handler.arg, ucp_ep_params_t, err_handler.arg);
    MTA_SAME(mskv_ucp_ep_params, ucp_ep_params_t, user_data);
    MTA_SAME(mskv_ucp_ep_params, ucp_ep_params_t, flags);
    MTA_SAME(mskv_ucp_ep_params, ucp_ep_params_t, sockaddr);
    MTA_SAME(mskv_ucp_ep_params, ucp_ep_params_t, conn_request);
    MTA_SAME(mskv_ucp_ep_params, ucp_ep_params_t, name);
    MTA_SAME(mskv_ucp_ep_params, ucp_ep_params_t, local_sockaddr);
    EXPECT_EQ(MSKV_UCP_ERR_HANDLING_MODE_PEER, (int)UCP_ERR_HANDLING_MODE_PEER);
    EXPECT_EQ(MSKV_UCP_ERR_HANDLING_MODE_NONE, (int)UCP_ERR_HANDLING_MODE_NONE);   /* the data endpoint's */
}

TEST(ucx_request_param_mirrors_ucp_request_param_t) {
    MTA_SIZE(mskv_ucp_request_param, ucp_request_param_t);
    MTA_SAME(mskv_ucp_request_param, ucp_request_param_t, op_attr_mask);
    MTA_SAME(mskv_ucp_request_param, ucp_request_param_t, flags);
    MTA_SAME(mskv_ucp_request_param, ucp_request_param_t, request);
    MTA_SAME(mskv_ucp_request_param, ucp_request_param_t, cb);
    MTA_SAME(mskv_ucp_request_param, ucp_request_param_t, datatype);
    MTA_SAME(mskv_ucp_request_param, ucp_request_param_t, user_data);
    MTA_SAME(mskv_ucp_request_param, ucp_request_param_t, reply_buffer);
    MTA_SAME(mskv_ucp_request_param, ucp_request_param_t, memory_type);
    MTA_SAME(mskv_ucp_request_param, ucp_request_param_t, recv_info);
    MTA_SAME(mskv_ucp_request_param, ucp_request_param_t, memh);
    MTA_SIZE(mskv_ucp_tag_recv_info, ucp_tag_recv_info_t);
    MTA_SAME(mskv_ucp_tag_recv_info, ucp_tag_recv_info_t, length);
    MTA_SIZE(mskv_ucp_dt_iov, ucp_dt_iov_t);
    MTA_SAME(mskv_ucp_dt_iov, ucp_dt_iov_t, length);
}

TEST(ucx_constants_equal_the_real_ones) {
    EXPECT_EQ(MSKV_UCS_OK, (int)UCS_OK);
    EXPECT_EQ(MSKV_UCS_INPROGRESS, (int)UCS_INPROGRESS);
    EXPECT_EQ(MSKV_UCS_ERR_CANCELED, (int)UCS_ERR_CANCELED);
    EXPECT_EQ(MSKV_UCS_ERR_LAST, (int)UCS_ERR_LAST);
    EXPECT_EQ_U64(MSKV_UCP_PARAM_FIELD_FEATURES, (uint64_t)UCP_PARAM_FIELD_FEATURES);
    EXPECT_EQ_U64(MSKV_UCP_FEATURE_TAG, (uint64_t)UCP_FEATURE_TAG);
    EXPECT_EQ_U64(MSKV_UCP_FEATURE_WAKEUP, (uint64_t)UCP_FEATURE_WAKEUP);
    EXPECT_EQ(MSKV_UCS_ERR_BUSY, (int)UCS_ERR_BUSY);
    EXPECT_EQ_U64(MSKV_UCP_WORKER_PARAM_FIELD_THREAD_MODE, (uint64_t)UCP_WORKER_PARAM_FIELD_THREAD_MODE);
    EXPECT_EQ_U64(MSKV_UCP_LISTENER_PARAM_FIELD_SOCK_ADDR, (uint64_t)UCP_LISTENER_PARAM_FIELD_SOCK_ADDR);
    EXPECT_EQ_U64(MSKV_UCP_LISTENER_PARAM_FIELD_CONN_HANDLER, (uint64_t)UCP_LISTENER_PARAM_FIELD_CONN_HANDLER);
    EXPECT_EQ_U64(MSKV_UCP_LISTENER_ATTR_FIELD_SOCKADDR, (uint64_t)UCP_LISTENER_ATTR_FIELD_SOCKADDR);
    EXPECT_EQ_U64(MSKV_UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, (uint64_t)UCP_EP_PARAM_FIELD_REMOTE_ADDRESS);
    EXPECT_EQ_U64(MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE, (uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE);
    EXPECT_EQ_U64(MSKV_UCP_EP_PARAM_FIELD_ERR_HANDLER, (uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER);
    EXPECT_EQ_U64(MSKV_UCP_EP_PARAM_FIELD_SOCK_ADDR, (uint64_t)UCP_EP_PARAM_FIELD_SOCK_ADDR);
    EXPECT_EQ_U64(MSKV_UCP_EP_PARAM_FIELD_FLAGS, (uint64_t)UCP_EP_PARAM_FIELD_FLAGS);
    EXPECT_EQ_U64(MSKV_UCP_EP_PARAM_FIELD_CONN_REQUEST, (uint64_t)UCP_EP_PARAM_FIELD_CONN_REQUEST);
    EXPECT_EQ_U64(MSKV_UCP_EP_PARAMS_FLAGS_CLIENT_SERVER, (uint64_t)UCP_EP_PARAMS_FLAGS_CLIENT_SERVER);
    EXPECT_EQ_U64(MSKV_UCP_EP_CLOSE_FLAG_FORCE, (uint64_t)UCP_EP_CLOSE_FLAG_FORCE);
    EXPECT_EQ_U64(MSKV_UCP_OP_ATTR_FIELD_CALLBACK, (uint64_t)UCP_OP_ATTR_FIELD_CALLBACK);
    EXPECT_EQ_U64(MSKV_UCP_OP_ATTR_FIELD_USER_DATA, (uint64_t)UCP_OP_ATTR_FIELD_USER_DATA);
    EXPECT_EQ_U64(MSKV_UCP_OP_ATTR_FIELD_DATATYPE, (uint64_t)UCP_OP_ATTR_FIELD_DATATYPE);
    EXPECT_EQ_U64(MSKV_UCP_OP_ATTR_FIELD_FLAGS, (uint64_t)UCP_OP_ATTR_FIELD_FLAGS);
    EXPECT_EQ_U64(MSKV_UCP_OP_ATTR_FIELD_RECV_INFO, (uint64_t)UCP_OP_ATTR_FIELD_RECV_INFO);
    EXPECT_EQ_U64(MSKV_UCP_OP_ATTR_FLAG_NO_IMM_CMPL, (uint64_t)UCP_OP_ATTR_FLAG_NO_IMM_CMPL);
    EXPECT_EQ_U64(MSKV_UCP_DATATYPE_CONTIG_BYTE, (uint64_t)ucp_dt_make_contig(1));
    EXPECT_EQ_U64(MSKV_UCP_DATATYPE_IOV, (uint64_t)ucp_dt_make_iov());
    EXPECT_EQ((long)sizeof(mskv_ucp_tag), (long)sizeof(ucp_tag_t));
    EXPECT_EQ((long)sizeof(mskv_ucp_datatype), (long)sizeof(ucp_datatype_t));
    EXPECT_EQ((long)sizeof(mskv_ucs_status), (long)sizeof(ucs_status_t));
}

#endif
