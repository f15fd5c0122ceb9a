/*
 * A status with its sentence: what an internal call hands back when it
 * fails, so that the message can name the peer, the step and the system
 * call, and reach brg_comm_last_error.
 */
#ifndef BRG_STATUS_H
#define BRG_STATUS_H

#include "brigade.h"

/* A detailed error message travelling with a brg_status. `logged` says
 * whether the function that wrote it also logged it (brg__error), so that
 * whoever reports it further up does not log it a second time. */
#define BRG__ERRLEN 512
typedef struct brg__errbuf {
  char msg[BRG__ERRLEN];
  int logged;
} brg__errbuf;

/* Formats the message into `eb` (when not NULL) without logging it, for
 * checks whose caller decides whether and how to report; returns status. */
brg_status brg__error_quiet(brg__errbuf *eb, brg_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
