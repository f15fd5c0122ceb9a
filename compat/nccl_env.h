#ifndef BRIGADE_COMPAT_NCCL_ENV_H
#define BRIGADE_COMPAT_NCCL_ENV_H

/* NCCL_* variables set as the BRIGADE_* ones with their meaning (once, at
 * the library's first call that reaches brigade; nccl_env.c). */
void brg__nccl_env_apply(void);
/* NCCL_DEBUG, NCCL_DEBUG_FILE and NCCL_DEBUG_SUBSYS again
 * (ncclResetDebugInit). */
void brg__nccl_env_debug_again(void);

#endif
