/* fuzz_screen_decode.c - libFuzzer target for the screen plugin's image
 * decoding entry (plugins/screen/imgdecode.c): any bytes are either
 * refused with a negative error and a message, or decoded into an image
 * within the limits, whose pixels are all readable. Small limits keep each
 * run fast (a 64-megapixel header must be refused, not allocated). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "imgdecode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rlai_screen_limits lim = { .max_bytes = 1 << 20, .max_width = 2048, .max_height = 2048,
                               .max_pixels = 1 << 20 };
    rlai_screen_image img;
    char err[256];
    int rc = rlai_screen_decode(data, size, &lim, &img, err, sizeof err);
    if (rc < 0) {
        if (img.rgb || !err[0])
            abort();
        return 0;
    }
    if (rc != 0 || !img.rgb || img.width < 1 || img.height < 1 || img.width > lim.max_width ||
        img.height > lim.max_height || (long long)img.width * img.height > lim.max_pixels)
        abort();
    /* touch every byte (ASan/MSan see a short buffer) */
    unsigned sum = 0;
    for (size_t i = 0; i < (size_t)img.width * (size_t)img.height * 3; i++)
        sum += img.rgb[i];
    volatile unsigned sink = sum;
    (void)sink;
    rlai_screen_image_free(&img);
    return 0;
}
