/* Entry points of the moesim commands, one file each under cli/. */
#ifndef MOESIM_CLI_COMMANDS_H
#define MOESIM_CLI_COMMANDS_H

int cmd_trace(int argc, char **argv);
int cmd_trace_info(int argc, char **argv);
int cmd_trace_validate(int argc, char **argv);
int cmd_trace_import(int argc, char **argv);
int cmd_trace_export(int argc, char **argv);
int cmd_trace_stats(int argc, char **argv);
int cmd_trace_synth(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_record(int argc, char **argv);
int cmd_sweep(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_sim(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_validate(int argc, char **argv);

#endif
