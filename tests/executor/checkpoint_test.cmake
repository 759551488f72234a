# Sharded checkpoints through the executor program under mpirun (ctest label mpi): a checkpoint
# saved under ZeRO-3 on 4 ranks resumes under ZeRO-2 on 2 ranks and DDP on 1 with the saved
# parameters (the resumed run's initial_params_sha256 is the saved run's final_params_sha256);
# 2 steps, a save and 2 resumed steps end bit for bit as 4 uninterrupted steps; consolidate writes
# the bytes final_params_sha256 hashes; a truncated, corrupted or mismatched checkpoint and bad
# options are one line naming the file or the option, exit code 2.
# Arguments: MPIRUN, EXECUTOR, PLANNER, DATA (this folder's data/), WORK (a scratch folder).
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(mpirun ${MPIRUN} --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none)

include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)

function(expect_equal what a b)
  if(NOT "${a}" STREQUAL "${b}")
    message(FATAL_ERROR "${what}: \"${a}\" != \"${b}\"")
  endif()
  message(STATUS "${what}: ${a}")
endfunction()

# The test model scaled down further: a few seconds for every run on two cores.
set(scale --scale-layers 2 --scale-hidden 32 --scale-heads 4 --scale-vocab 256 --scale-seq 16)
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
run_expect(2 COMMAND ${mpirun} -np 1 ${EXECUTOR} --plan ddp-1.json --scale-layers 3
                     --scale-hidden 32 --scale-heads 4 --scale-vocab 256 --scale-seq 16 --steps 1
                     --out x.json --resume ckpt
           EXPECT "ckpt/index.json: /model/layers: the checkpoint's model has 2, the run's model 3")
file(COPY ${WORK}/ckpt/ DESTINATION ${WORK}/cut-index)
string(SUBSTRING "${index}" 0 200 cut)
file(WRITE ${WORK}/cut-index/index.json "${cut}")
run_expect(2 COMMAND ${EXECUTOR} consolidate cut-index --out x.bin
           EXPECT "cut-index/index.json: not valid JSON")

# Options: one line naming the option and the value.
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --save-every 2
           EXPECT "--save-every: 2 needs --save DIR")
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --save s --save-every 0
           EXPECT "--save-every: must be between 1 and 100000, got 0")
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --save ddp-1.json
           EXPECT "--save: \"ddp-1.json\" exists and is not a folder")
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --resume nowhere
           EXPECT "--resume: no checkpoint in \"nowhere\" (no index.json)")
run_expect(2 COMMAND ${EXECUTOR} --plan ddp-1.json --out x.json --resume ckpt --rehearse-rank 0
                     --world 1 EXPECT "--resume: a rehearsal holds one rank's state only")
run_expect(2 COMMAND ${EXECUTOR} consolidate ckpt EXPECT "--out is required")
