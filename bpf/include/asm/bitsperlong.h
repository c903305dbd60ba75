/* See README. */
#include <asm-generic/bitsperlong.h>
