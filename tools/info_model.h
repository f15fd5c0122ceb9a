/* brigade-info --model (info_model.c): argv after --model; the exit status. */
#ifndef BRG_INFO_MODEL_H
#define BRG_INFO_MODEL_H
int brg__info_model(int argc, char **argv);
/* brigade-info --device-shape LINK NRANKS [NSLOTS [SIZE...]]: kernel
 * mode's channels and slot by the model, one tab-separated line a size. */
int brg__info_device_shape(int argc, char **argv);
/* brigade-info --device-model [LINK] [--gpus N] [--NAME VALUE...] [SIZE...]:
 * kernel mode's predicted times by the model, tab-separated (bench/model
 * gpu prints them). */
int brg__info_device_model(int argc, char **argv);
/* brigade-info --calibrate --out FILE [--ranks N]: measures this host's
 * links and writes a model file (info_calibrate.c); the exit status. */
int brg__info_calibrate(int argc, char **argv);
#endif
