/*
 * The latency-bound allreduce schedules (BRIGADE_ALGO=tree, rhd): pure
 * arithmetic on positions 0..N-1, which the communicator maps to ranks
 * (its ring order, so neighbouring positions share a host), as
 * schedule.h does for the ring. runtime/coll/lat.c runs them over
 * point-to-point links.
 *
 * Double binary tree. Tree 0 numbers the positions q = p + 1 = 1..N. Its
 * root is R, the largest power of two <= N; below R lies the perfect tree
 * of 1..R-1 (node q with lowest set bit b has children q -+ b/2), and the
 * positions R+1..N form the same tree again, shifted by R, as R's second
 * child:
 *
 *   N = 6, tree 0:    4         tree 1 (N even: mirrored, q -> N+1-q):  3
 *                   /   \                                              /   \
 *                  2     6                                            1     5
 *                 / \   /                                              \   / \
 *                1   3 5                                                2 4   6
 *
 * Odd q are the leaves of tree 0. Tree 1 is tree 0 mirrored when N is
 * even and shifted by one position when N is odd, so that a leaf of one
 * tree is (but for one position at odd N) inside the other: every rank
 * sends and receives about as many bytes in all. Half the buffer goes up
 * and down each tree, slice by slice: a slice is reduced from the leaves
 * to the root, which then sends the result back down (ceil(log2(N+1))
 * levels each way).
 *
 * Recursive halving and doubling (Rabenseifner). With P the largest power
 * of two <= N and E = N - P, positions 2i and 2i+1 (i < E) fold first:
 * the even one sends its whole buffer to the odd one and sits out, the odd
 * one takes virtual rank v = i; position p >= 2E takes v = p - E. The P
 * virtual ranks cut the buffer into P blocks and halve it log2(P) times
 * (round j: partner v ^ (P >> (j+1)); the rank whose bit is set keeps the
 * upper half and sends the lower), which leaves block v whole on v; the
 * rounds run back (doubling) to gather every block, and the odd positions
 * send the result to their even partners.
 */
#ifndef BRG_SCHEDULE_LAT_H
#define BRG_SCHEDULE_LAT_H

#include <stddef.h>

#include "schedule.h"

/* The largest power of two <= n (n >= 1). */
static inline BRG_HD int brg__pow2_floor(int n) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

/* Bits of a power of two. */
static inline BRG_HD int brg__log2_exact(int p) {
  int k = 0;
  while ((1 << k) < p) k++;
  return k;
}

/* One node of a tree: positions, -1 where there is none. */
typedef struct brg__tree_node {
  int parent;
  int child[2];
} brg__tree_node;

/* Tree 0 on 1-based positions q = 1..n: parent and children, 0 for none. */
static inline BRG_HD void brg__btree1(int n, int q, int *parent, int *c0, int *c1) {
  int base = 0, up = 0;
  for (;;) {
    int r = brg__pow2_floor(n);
    if (q == r) {
      *parent = up;
      *c0 = r > 1 ? base + r / 2 : 0;
      *c1 = n > r ? base + r + brg__pow2_floor(n - r) : 0;
      return;
    }
    if (q < r) {
      int b = q & -q;
      *c0 = b > 1 ? base + q - b / 2 : 0;
      *c1 = b > 1 ? base + q + b / 2 : 0;
      if (2 * b == r)
        *parent = base + r;
      else
        *parent = base + (((q / b) & 3) == 1 ? q + b : q - b);
      return;
    }
    up = base + r;
    base += r;
    n -= r;
    q -= r;
  }
}

/* Position p's node in tree t (0 or 1) of the double binary tree of n. */
static inline BRG_HD brg__tree_node brg__dbtree_node(int n, int t, int p) {
  brg__tree_node nd = {-1, {-1, -1}};
  if (n < 2) return nd;
  /* tree 1: position p plays tree 0's position m(p); m is its own inverse
   * when mirrored, the shift's inverse is undone below */
  int mirror = t == 1 && n % 2 == 0, shift = t == 1 && n % 2 == 1;
  int p0 = mirror ? n - 1 - p : shift ? (p + n - 1) % n : p;
  int v[3];
  brg__btree1(n, p0 + 1, &v[0], &v[1], &v[2]);
  for (int i = 0; i < 3; i++) {
    int x = v[i] - 1; /* tree 0's position, or -1 */
    if (x >= 0) x = mirror ? n - 1 - x : shift ? (x + 1) % n : x;
    v[i] = x;
  }
  nd.parent = v[0];
  nd.child[0] = v[1];
  nd.child[1] = v[2];
  return nd;
}

/* The root of tree t of n positions. */
static inline BRG_HD int brg__dbtree_root(int n, int t) {
  int r0 = brg__pow2_floor(n) - 1;
  if (t == 0 || n < 2) return r0;
  return n % 2 == 0 ? n - 1 - r0 : (r0 + 1) % n;
}

/* Levels of either tree of n positions: R and the perfect tree below it
 * (the part beyond R is a smaller tree one level under R). */
static inline BRG_HD int brg__dbtree_depth(int n) {
  return n < 1 ? 0 : brg__log2_exact(brg__pow2_floor(n)) + 1;
}

/* Recursive halving and doubling: where position p stands. */
typedef struct brg__rhd {
  int p2;     /* P: the largest power of two <= N */
  int rounds; /* log2(P) */
  int vrank;  /* its virtual rank, or -1 when it folds into `fold` and sits out */
  int fold;   /* the position it folds with (the even one sends to the odd one), or -1 */
} brg__rhd;

static inline BRG_HD brg__rhd brg__rhd_of(int n, int p) {
  brg__rhd r;
  r.p2 = brg__pow2_floor(n);
  r.rounds = brg__log2_exact(r.p2);
  int extra = n - r.p2;
  if (p < 2 * extra) {
    r.vrank = p % 2 ? p / 2 : -1;
    r.fold = p % 2 ? p - 1 : p + 1;
  } else {
    r.vrank = p - extra;
    r.fold = -1;
  }
  return r;
}

/* The position of virtual rank v. */
static inline BRG_HD int brg__rhd_pos(int n, int v) {
  int extra = n - brg__pow2_floor(n);
  return v < extra ? 2 * v + 1 : v + extra;
}

/* The blocks [*lo, *hi) virtual rank v holds after halving round j
 * (j = -1: before the first, all P blocks). */
static inline BRG_HD void brg__rhd_window(int p2, int v, int j, int *lo, int *hi) {
  int l = 0, size = p2;
  for (int i = 0; i <= j; i++) {
    size /= 2;
    if (v & (p2 >> (i + 1))) l += size;
  }
  *lo = l;
  *hi = l + size;
}

/* The partner of virtual rank v in halving round j (doubling runs the
 * rounds back, j = rounds-1 down to 0). */
static inline BRG_HD int brg__rhd_partner(int p2, int v, int j) {
  return v ^ (p2 >> (j + 1));
}

#endif
