/* See README. */
#include <asm-generic/swab.h>
