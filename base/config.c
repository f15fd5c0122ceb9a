#include "config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t cfg_lock = PTHREAD_MUTEX_INITIALIZER;

brg_status brg__config_parse_int(const char *s, int64_t *out) {
  if (!s || !*s) return BRG_ERR_INVALID_ARGUMENT;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end) return BRG_ERR_INVALID_ARGUMENT;
  *out = v;
  return BRG_SUCCESS;
}

brg_status brg__config_parse_size(const char *s, int64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+') return BRG_ERR_INVALID_ARGUMENT;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return BRG_ERR_INVALID_ARGUMENT;
  unsigned long long mult = 1;
  if (*end) {
    switch (*end) {
    case 'k':
    case 'K': mult = BRG__KiB; break;
    case 'm':
    case 'M': mult = BRG__MiB; break;
    case 'g':
    case 'G': mult = BRG__GiB; break;
    default: return BRG_ERR_INVALID_ARGUMENT;
    }
    end++;
    if (*end == 'i') end++; /* KiB */
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return BRG_ERR_INVALID_ARGUMENT;
  }
  if (v > (unsigned long long)INT64_MAX / mult) return BRG_ERR_INVALID_ARGUMENT;
  *out = (int64_t)(v * mult);
  return BRG_SUCCESS;
}

static brg_status parse_entry(const brg__cfg_entry *e, const char *v, int64_t *out,
                              brg__errbuf *err) {
  if (e->kind == BRG__CFG_KIND_STRING) return BRG_SUCCESS;
  brg_status s =
      e->kind == BRG__CFG_KIND_INT ? brg__config_parse_int(v, out) : brg__config_parse_size(v, out);
  /* No logging here: the logger itself reads a section. */
  if (s != BRG_SUCCESS)
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT, "%s=\"%s\" is not %s", e->name, v,
                            e->kind == BRG__CFG_KIND_INT ? "an integer"
                                                         : "a size (like 64K or 4M)");
  if (*out < e->min || *out > e->max)
    return brg__error_quiet(err, BRG_ERR_INVALID_ARGUMENT, "%s=%s is out of range [%lld, %lld]",
                            e->name, v, (long long)e->min, (long long)e->max);
  return BRG_SUCCESS;
}

static void load(brg__cfg_section *sec) {
  for (int i = 0; i < sec->count; i++) {
    brg__cfg_entry *e = &sec->entries[i];
    const char *v = getenv(e->name);
    e->is_set = v != NULL && *v != 0;
    e->value = e->is_set ? v : e->defval;
    if (parse_entry(e, e->defval, &e->ival, NULL) != BRG_SUCCESS) e->ival = 0;
    if (e->is_set && sec->status == BRG_SUCCESS) {
      int64_t x = 0;
      brg_status s = parse_entry(e, v, &x, &sec->err);
      if (s != BRG_SUCCESS) {
        sec->status = s;
        e->value = e->defval;
      } else {
        e->ival = x;
      }
    }
  }
}

brg_status brg__config_load(brg__cfg_section *s, brg__errbuf *err) {
  if (!__atomic_load_n(&s->loaded, __ATOMIC_ACQUIRE)) {
    pthread_mutex_lock(&cfg_lock);
    if (!s->loaded) {
      load(s);
      __atomic_store_n(&s->loaded, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cfg_lock);
  }
  if (s->status != BRG_SUCCESS && err) *err = s->err;
  return s->status;
}

int64_t brg__config_int(brg__cfg_section *s, int id) {
  brg__config_load(s, NULL);
  return s->entries[id].ival;
}

const char *brg__config_str(brg__cfg_section *s, int id) {
  brg__config_load(s, NULL);
  return s->entries[id].value;
}

int brg__config_is_set(brg__cfg_section *s, int id) {
  brg__config_load(s, NULL);
  return s->entries[id].is_set;
}

void brg__config_print(brg__cfg_section *s, FILE *f) {
  brg__config_load(s, NULL);
  for (int i = 0; i < s->count; i++) {
    const brg__cfg_entry *e = &s->entries[i];
    fprintf(f, "  %-24s = %-10s %s(default \"%s\")\n      %s\n", e->name, e->value,
            e->is_set ? "[set] " : "", e->defval, e->help);
  }
}

/* One cell of a Markdown table: '|' escaped, newlines as spaces. */
static void md_cell(FILE *f, const char *text) {
  for (const char *c = text; *c; c++) {
    if (*c == '|')
      fputs("\\|", f);
    else
      fputc(*c == '\n' ? ' ' : *c, f);
  }
}

void brg__config_print_markdown(const brg__cfg_section *s, FILE *f) {
  for (int i = 0; i < s->count; i++) {
    const brg__cfg_entry *e = &s->entries[i];
    fprintf(f, "| `%s` | %s | ", e->name, e->defval[0] ? e->defval : "(empty)");
    md_cell(f, e->help);
    if (e->kind != BRG__CFG_KIND_STRING)
      fprintf(f, " (%s, %lld to %lld)", e->kind == BRG__CFG_KIND_SIZE ? "bytes" : "integer",
              (long long)e->min, (long long)e->max);
    fputs(" |\n", f);
  }
}
