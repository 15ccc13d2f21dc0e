/* GPU attention launch wrappers: implementation (included by mstar_kv_cuda.h
   in its implementation section; pasted there by the lead later).
   Empty until the wrappers land; must stay valid C99 and C++ without CUDA headers. */
