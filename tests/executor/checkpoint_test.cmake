# Sharded checkpoints through the executor program under mpirun (ctest label mpi): a checkpoint
# saved under ZeRO-3 on 4 ranks resumes under ZeRO-2 on 2 ranks and DDP on 1 with the saved
# parameters (the resumed run's initial_params_sha256 is the saved run's final_params_sha256);
# 2 steps, a save and 2 resumed steps end bit for bit as 4 uninterrupted steps; consolidate writes
# the bytes final_params_sha256 hashes; a truncated, corrupted, edited or mismatched checkpoint and
# bad options are one line naming the file or the option, exit code 2; a --save folder that holds
# another run's checkpoint, cannot be made, or is being written by another executor is refused
# before the first step.
# Arguments: MPIRUN, EXECUTOR, PLANNER, DATA (this folder's data/), WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)
start_program_test()

function(expect_equal what a b)
  if(NOT "${a}" STREQUAL "${b}")
    message(FATAL_ERROR "${what}: \"${a}\" != \"${b}\"")
  endif()
  message(STATUS "${what}: ${a}")
endfunction()

# The last run_expect's run was refused before its first step.
function(expect_no_step what)
  if(last_stderr MATCHES "executor: step [0-9]+/")
    message(FATAL_ERROR "${what}: refused after training:\n${last_stderr}")
  endif()
endfunction()

# DIR/index.json.sha256 for the index as it now is, as whoever edits an index can write it.
function(sign_index dir)
  file(SHA256 ${dir}/index.json digest)
  file(WRITE ${dir}/index.json.sha256 "${digest}  index.json\n")
endfunction()

# The test model scaled down further: a few seconds for every run on two cores.
set(scale --layers 2 --hidden 32 --heads 4 --vocab 256 --seq-len 16)
set(job --model ${DATA}/llama-tiny.json --hardware ${DATA}/cpu-test.json --seq-len 64
        --global-batch 4 --micro-batch 1 --attention eager --checkpointing none --offload none --recipe executor
        --precision fp32)
foreach(plan "zero3;4" "zero2;2" "ddp;1")
  list(GET plan 0 strategy)
  list(GET plan 1 gpus)
  run_expect(0 COMMAND ${PLANNER} recommend ${job} --gpus ${gpus} --strategy ${strategy}
                       --emit plan OUTPUT text)
  file(WRITE ${WORK}/${strategy}-${gpus}.json "${text}")
endforeach()

# Saved under ZeRO-3 on 4 ranks after steps 1 and 2 (the index names step 2's parts only).
run_expect(0 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan zero3-4.json ${scale} --steps 2
                     --out saved.json --save ckpt --save-every 1)
file(READ ${WORK}/saved.json saved)
string(JSON saved_final GET "${saved}" final_params_sha256)
file(READ ${WORK}/ckpt/index.json index)
string(JSON step GET "${index}" step)
string(JSON parts LENGTH "${index}" files)
string(JSON part1 GET "${index}" files 1 path)
expect_equal("index step" "${step}" 2)
expect_equal("parts" "${parts}" 4)
if(EXISTS ${WORK}/ckpt/step-00000001)
  message(FATAL_ERROR "step 1's parts are still there after step 2's index")
endif()

# Resumed under ZeRO-2 on 2 ranks and DDP on 1: the parameters they start from are the saved ones.
foreach(resume "zero2;2" "ddp;1")
  list(GET resume 0 strategy)
  list(GET resume 1 ranks)
  run_expect(0 COMMAND ${mpirun} -np ${ranks} ${EXECUTOR} --plan ${strategy}-${ranks}.json ${scale}
                       --steps 1 --out resumed-${strategy}.json --resume ckpt)
  file(READ ${WORK}/resumed-${strategy}.json run)
  string(JSON initial GET "${run}" initial_params_sha256)
  string(JSON resumed_step GET "${run}" execution resumed_from step)
  expect_equal("${strategy} on ${ranks}: initial hash = saved final hash" "${initial}"
               "${saved_final}")
  expect_equal("${strategy} on ${ranks}: resumed from step" "${resumed_step}" 2)
endforeach()

# Interrupted and resumed with the same plan = uninterrupted, bit for bit.
run_expect(0 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan zero3-4.json ${scale} --steps 4
                     --out uninterrupted.json)
run_expect(0 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan zero3-4.json ${scale} --steps 2
                     --out continued.json --resume ckpt)
file(READ ${WORK}/uninterrupted.json run)
string(JSON uninterrupted_final GET "${run}" final_params_sha256)
string(JSON loss4 GET "${run}" loss 3)
file(READ ${WORK}/continued.json run)
string(JSON continued_final GET "${run}" final_params_sha256)
string(JSON loss2 GET "${run}" loss 1)
expect_equal("2 + 2 steps = 4 steps: final hash" "${continued_final}" "${uninterrupted_final}")
expect_equal("2 + 2 steps = 4 steps: last loss" "${loss2}" "${loss4}")
# planner validate reads a run document with the hashes.
run_expect(0 COMMAND ${PLANNER} validate --plan zero3-4.json --run continued.json)

# consolidate writes the full fp32 parameters: the bytes final_params_sha256 hashes.
run_expect(0 COMMAND ${EXECUTOR} consolidate ckpt --out model.bin EXPECT "wrote model.bin")
file(SHA256 ${WORK}/model.bin model_sha256)
expect_equal("sha256 of model.bin = final_params_sha256" "${model_sha256}" "${saved_final}")
# ... and into a device it writes through, never renaming over it: a null device of this test's
# own where one can be made (mknod, as root), so that the old behaviour breaks nothing else.
execute_process(COMMAND mknod ${WORK}/null c 1 3 RESULT_VARIABLE rc ERROR_QUIET)
if(rc EQUAL 0)
  run_expect(0 COMMAND ${EXECUTOR} consolidate ckpt --out null EXPECT "wrote null")
  execute_process(COMMAND test -c ${WORK}/null RESULT_VARIABLE still_device)
  if(NOT still_device EQUAL 0)
    message(FATAL_ERROR "consolidate --out replaced a character device with a file")
  endif()
else()
  message(STATUS "mknod not permitted: consolidate into a device not checked")
endif()

# Damaged or mismatched checkpoints: one line naming the file, exit code 2, on any rank count.
file(COPY ${WORK}/ckpt/ DESTINATION ${WORK}/truncated)
file(REMOVE ${WORK}/truncated/${part1})
file(WRITE ${WORK}/truncated/${part1} "") # an empty part
run_expect(2 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan zero2-2.json ${scale} --steps 1
                     --out x.json --resume truncated
           EXPECT "truncated/${part1}: truncated: 0 bytes")
run_expect(2 COMMAND ${EXECUTOR} consolidate truncated --out x.bin
           EXPECT "truncated/${part1}: truncated")
file(COPY ${WORK}/ckpt/ DESTINATION ${WORK}/corrupted)
string(REPLACE "part-00001" "part-00003" part3 "${part1}")
file(SIZE ${WORK}/ckpt/${part3} size)
# The same size, other bytes: a file of the right length whose checksum is wrong.
string(REPEAT "x" ${size} junk)
file(WRITE ${WORK}/corrupted/${part3} "${junk}")
run_expect(2 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan zero2-2.json ${scale} --steps 1
                     --out x.json --resume corrupted EXPECT "corrupted/${part3}: corrupted")
run_expect(2 COMMAND ${mpirun} -np 1 ${EXECUTOR} --plan ddp-1.json --layers 3
                     --hidden 32 --heads 4 --vocab 256 --seq-len 16 --steps 1
                     --out x.json --resume ckpt
           EXPECT "ckpt/index.json: /model/layers: the checkpoint's model has 2, the run's model 3")
file(COPY ${WORK}/ckpt/ DESTINATION ${WORK}/cut-index)
string(SUBSTRING "${index}" 0 200 cut)
file(WRITE ${WORK}/cut-index/index.json "${cut}")
run_expect(2 COMMAND ${EXECUTOR} consolidate cut-index --out x.bin
           EXPECT "cut-index/index.json: its sha256 is " ", index.json.sha256 says ")
sign_index(${WORK}/cut-index)
run_expect(2 COMMAND ${EXECUTOR} consolidate cut-index --out x.bin
           EXPECT "cut-index/index.json: not valid JSON")

# An index edited so that its ranges still tile every tensor, its digest recomputed: params of
# unit 0, elements [0, 2048) and [2048, 4096), swapped between parts 0 and 1. The parts are the
# saved ones; their ranges' digests, which cover the labels, tell.
file(COPY ${WORK}/ckpt/ DESTINATION ${WORK}/swapped)
string(JSON begin0 GET "${index}" files 0 segments 0 begin)
string(JSON end0 GET "${index}" files 0 segments 0 end)
string(JSON end1 GET "${index}" files 1 segments 0 end)
expect_equal("part 0 holds params of unit 0 from" "${begin0}" 0)
expect_equal("part 1 holds params of unit 0 up to" "${end1}" 4096)
string(JSON swapped SET "${index}" files 0 segments 0 begin 2048)
string(JSON swapped SET "${swapped}" files 0 segments 0 end 4096)
string(JSON swapped SET "${swapped}" files 1 segments 0 begin 0)
string(JSON swapped SET "${swapped}" files 1 segments 0 end 2048)
file(WRITE ${WORK}/swapped/index.json "${swapped}")
sign_index(${WORK}/swapped)
string(JSON part0 GET "${index}" files 0 path)
run_expect(2 COMMAND ${EXECUTOR} consolidate swapped --out x.bin
           EXPECT "swapped/${part0}: bytes [0, 8192) are not params of unit 0, elements [2048, 4096)")
run_expect(2 COMMAND ${mpirun} -np 1 ${EXECUTOR} --plan ddp-1.json ${scale} --steps 1
                     --out x.json --resume swapped
           EXPECT "swapped/${part0}: bytes [0, 8192) are not params of unit 0, elements [2048, 4096)")

# An index at step 2^63 - 1 (its digest recomputed): refused, no step number wraps.
file(COPY ${WORK}/ckpt/ DESTINATION ${WORK}/huge-step)
string(JSON huge SET "${index}" step 9223372036854775807)
string(JSON huge SET "${huge}" adamw_step 9223372036854775807)
file(WRITE ${WORK}/huge-step/index.json "${huge}")
sign_index(${WORK}/huge-step)
run_expect(2 COMMAND ${mpirun} -np 1 ${EXECUTOR} --plan ddp-1.json ${scale} --steps 1
                     --out x.json --resume huge-step
           EXPECT "huge-step/index.json: /step: must be <= 1000000000, got 9223372036854775807")

# --save into a folder with another run's checkpoint (here of another plan, and of a later step)
# is refused before the first step, naming what is there; --overwrite replaces it.
file(COPY ${WORK}/ckpt/ DESTINATION ${WORK}/taken)
run_expect(2 COMMAND ${mpirun} -np 1 ${EXECUTOR} --plan ddp-1.json ${scale} --steps 1
                     --out x.json --save taken
           EXPECT "--save: \"taken\" holds the checkpoint of model " " at step 2, saved by another plan "
                  "(/saved_by/strategy is \"zero3\", this run's \"ddp\"); --overwrite replaces it")
expect_no_step("--save into another run's checkpoint")
file(SHA256 ${WORK}/taken/index.json taken_after)
file(SHA256 ${WORK}/ckpt/index.json taken_before)
expect_equal("the refused run left the index as it was" "${taken_after}" "${taken_before}")
run_expect(0 COMMAND ${mpirun} -np 1 ${EXECUTOR} --plan ddp-1.json ${scale} --steps 1
                     --out x.json --save taken --overwrite)
file(READ ${WORK}/taken/index.json taken_index)
string(JSON taken_step GET "${taken_index}" step)
expect_equal("--overwrite: the folder holds the new run's step" "${taken_step}" 1)

# A --save folder that cannot be made is refused before the first step (and one that cannot be
# written in, where permission bits stop the user: not root).
run_expect(2 COMMAND ${mpirun} -np 1 ${EXECUTOR} --plan ddp-1.json ${scale} --steps 1
                     --out x.json --save ddp-1.json/ck
           EXPECT "--save: cannot make the folder \"ddp-1.json/ck\": Not a directory")
expect_no_step("--save under a file")
execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT uid STREQUAL "0")
  file(MAKE_DIRECTORY ${WORK}/ro)
  file(CHMOD ${WORK}/ro PERMISSIONS OWNER_READ OWNER_EXECUTE)
  run_expect(2 COMMAND ${mpirun} -np 1 ${EXECUTOR} --plan ddp-1.json ${scale} --steps 1
                       --out x.json --save ro/ck
             EXPECT "--save: cannot make the folder \"ro/ck\": Permission denied")
  expect_no_step("--save under a read-only folder")
  file(CHMOD ${WORK}/ro PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
endif()

# A job whose rank 1 dies at step 3, after step 2's save: the folder holds step 2 whole, its lock
# went with the job, and a run resumes from it and saves into it again.
execute_process(COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan zero2-2.json ${scale} --steps 4
                        --save-every 1 --save crashed --out x.json --inject-fault crash@1:3
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET WORKING_DIRECTORY ${WORK} TIMEOUT 120)
if(rc EQUAL 0)
  message(FATAL_ERROR "crash@1:3 ended with exit code 0")
endif()
run_expect(0 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan zero2-2.json ${scale} --steps 1
                     --out after-crash.json --resume crashed --save crashed)
file(READ ${WORK}/after-crash.json run)
string(JSON resumed_step GET "${run}" execution resumed_from step)
expect_equal("resumed after the crash from step" "${resumed_step}" 2)
if(EXISTS ${WORK}/crashed/step-00000002)
  message(FATAL_ERROR "step 2's folder is still there after step 3's save")
endif()

# Two executors saving into one folder: the second is refused, naming the first's process and
# host. The first holds the folder's lock from before its first step, where it hangs (an
# injected fault) until it is ended here.
string(JOIN " " mpirun_line ${mpirun})
string(JOIN " " scale_line ${scale})
set(run_line "${mpirun_line} -np 1 ${EXECUTOR} --plan ddp-1.json ${scale_line}")
execute_process(
  COMMAND sh -c "${run_line} --steps 2 --out held.json --save locked --inject-fault hang@0:1 \
                   --timeout-s 60 2>holder.err &
                 holder=$!
                 i=0
                 while [ ! -s locked/.lock ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
                 ${run_line} --steps 1 --out second.json --save locked
                 rc=$?
                 kill $holder
                 wait $holder
                 exit $rc"
  RESULT_VARIABLE rc ERROR_VARIABLE err WORKING_DIRECTORY ${WORK} TIMEOUT 120)
if(NOT rc EQUAL 2 OR NOT err MATCHES "executor: --save: \"locked\" is being written by pid [0-9]+ on host [^ \n]+\n")
  message(FATAL_ERROR "a second executor saving into one folder: exit code ${rc}:\n${err}")
endif()
message(STATUS "a second executor saving into one folder: ${err}")

# Options: one line naming the option and the value.
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --save-every 2
           EXPECT "--save-every: 2 needs --save DIR")
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --overwrite
           EXPECT "--overwrite: needs --save DIR")
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --save s --save-every 0
           EXPECT "--save-every: must be between 1 and 100000, got 0")
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --save ddp-1.json
           EXPECT "--save: \"ddp-1.json\" exists and is not a folder")
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --resume nowhere
           EXPECT "--resume: no checkpoint in \"nowhere\" (no index.json)")
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --resume ckpt --rehearse-rank 0
                     --world 1 EXPECT "--resume: a rehearsal holds one rank's state only")
run_expect(2 COMMAND ${EXECUTOR} consolidate ckpt EXPECT "--out is required")
