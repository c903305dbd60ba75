/* See README. */
#include <asm-generic/types.h>
