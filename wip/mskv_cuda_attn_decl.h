/* GPU attention launch wrappers: public declarations (included by
   mstar_kv_cuda.h in its declaration section; pasted there by the lead later).
   Empty until the wrappers land; must stay valid C99 and C++ without CUDA headers. */
