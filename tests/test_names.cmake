# Fails when a doctest TEST_CASE name holds a semicolon (see tests/CMakeLists.txt).
file(GLOB_RECURSE sources "${ROOT}/tests/*.cpp")
set(bad "")
foreach(f IN LISTS sources)
  file(READ "${f}" text)
  # The name: TEST_CASE( then a string literal, possibly broken over lines into adjacent literals.
  string(REGEX MATCHALL "TEST_CASE\\([ \t\r\n]*\"[^\"]*\"([ \t\r\n]*\"[^\"]*\")*" cases "${text}")
  foreach(c IN LISTS cases)
    # A semicolon inside the name splits `cases` itself: a piece without TEST_CASE is the rest of
    # a name cut at one.
    if(NOT c MATCHES "^TEST_CASE")
      file(RELATIVE_PATH rel "${ROOT}" "${f}")
      list(APPEND bad "${rel}")
    endif()
  endforeach()
endforeach()
if(bad)
  list(REMOVE_DUPLICATES bad)
  string(REPLACE ";" ", " bad "${bad}")
  message(FATAL_ERROR "test case names with a semicolon (ctest would run none of them): ${bad}")
endif()
