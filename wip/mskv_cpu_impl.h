/* CPU backend: implementation (inlined into mstar_kv.h's implementation). */
