/* See README. */
#include <asm-generic/errno.h>
