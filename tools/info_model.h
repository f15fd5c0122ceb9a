/* brigade-info --model (info_model.c): argv after --model; the exit status. */
#ifndef BRG_INFO_MODEL_H
#define BRG_INFO_MODEL_H
int brg__info_model(int argc, char **argv);
#endif
